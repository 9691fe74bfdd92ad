//! `ringbtl_t`: a [`Transport`] with C callbacks, and the functions that drive it.
//!
//! # Callbacks and re-entrancy
//!
//! The transport calls a receive handler with `&mut Transport` while its progress pass
//! runs; the handler stores that pointer in [`Shared::current`] for the duration of the C
//! call, and every function called back from C reaches the transport through it (never
//! through a second `&mut` made from the handle, which would alias the pass's).
//!
//! Completions and peer failures are queued by the transport's closures and delivered to
//! C after the pass, when no borrow of the transport is live: a completion callback may
//! then send through the handle directly. The queue keeps its capacity, so steady state
//! does not allocate.
//!
//! `depth` counts C callbacks running: `ringbtl_progress` and `ringbtl_wait` return 0
//! inside one (the outer pass continues), `ringbtl_destroy` is refused.

use std::cell::{Cell, RefCell, UnsafeCell};
use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::{self, NonNull};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use ringbtl::{
    parse_uri_list, Completion, Error, FailReason, PeerId, PutTarget, RegionAccess, RegionError,
    SendError, Tag, Transport, MAX_SEGMENTS,
};

use crate::config::RingbtlConfig;
use crate::status::{
    fail, fail_code, fail_with, guard, send_code, RINGBTL_ERR_BUSY, RINGBTL_ERR_INTERNAL,
    RINGBTL_ERR_INVALID, RINGBTL_ERR_UNREACHABLE, RINGBTL_OK,
};

/// A received active message (`ringbtl_recv_fn`).
pub type RecvFn = Option<
    unsafe extern "C" fn(ctx: *mut c_void, src: u32, tag: u8, data: *const c_void, len: usize),
>;
/// A finished send (`ringbtl_complete_fn`).
pub type CompleteFn =
    Option<unsafe extern "C" fn(ctx: *mut c_void, peer: u32, cookie: u64, status: c_int)>;
/// A failed peer (`ringbtl_error_fn`).
pub type ErrorFn =
    Option<unsafe extern "C" fn(ctx: *mut c_void, peer: u32, status: c_int, msg: *const c_char)>;

/// A process that was never added connected (`ringbtl_resolve_fn`): nonzero accepts it
/// (after adding it with `ringbtl_add_peer`), zero refuses it.
pub type ResolveFn = Option<unsafe extern "C" fn(ctx: *mut c_void, peer: u32) -> c_int>;

/// One element of a gather list (`ringbtl_iov_t`), laid out as C lays out
/// `struct { const void *base; size_t len; }` (and as `struct iovec`):
///
/// ```text
///  0                 8                 16   (x86_64, aarch64: LP64)
///  +-----------------+-----------------+
///  | base: pointer   | len: size_t     |
///  +-----------------+-----------------+
/// ```
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RingbtlIov {
    /// First byte (may be NULL when `len` is 0).
    pub base: *const c_void,
    /// Number of bytes.
    pub len: usize,
}

// The layout above, checked at compile time (the C test checks the C side).
const _: () = {
    assert!(size_of::<RingbtlIov>() == 2 * size_of::<usize>());
    assert!(std::mem::offset_of!(RingbtlIov, len) == size_of::<*const c_void>());
};

/// A transport driven from C (`ringbtl_t`).
pub struct Ringbtl {
    /// Reached only through [`transport`](Self::transport).
    transport: UnsafeCell<Transport>,
    shared: Rc<Shared>,
    uris: CString,
    local_id: u32,
    backend: &'static CStr,
    max_frame: usize,
}

/// What the transport's closures and the exported functions share.
struct Shared {
    /// The C receive callback and its context per tag.
    recv: [Cell<Option<(RecvCbFn, *mut c_void)>>; 256],
    complete: Cell<Option<(CompleteCbFn, *mut c_void)>>,
    error: Cell<Option<(ErrorCbFn, *mut c_void)>>,
    resolve: Cell<Option<(ResolveCbFn, *mut c_void)>>,
    /// Completions and failures waiting for delivery after the pass.
    events: RefCell<VecDeque<Ev>>,
    /// The transport as lent to the receive handler running now (null otherwise).
    current: Cell<*mut Transport>,
    /// C callbacks running.
    depth: Cell<u32>,
}

type RecvCbFn = unsafe extern "C" fn(*mut c_void, u32, u8, *const c_void, usize);
type CompleteCbFn = unsafe extern "C" fn(*mut c_void, u32, u64, c_int);
type ErrorCbFn = unsafe extern "C" fn(*mut c_void, u32, c_int, *const c_char);
type ResolveCbFn = unsafe extern "C" fn(*mut c_void, u32) -> c_int;

enum Ev {
    Done(Completion),
    Failed(PeerId, FailReason),
}

/// Marks a C callback as running; restores the previous state when dropped (also on
/// unwinding).
struct InCallback<'a> {
    shared: &'a Shared,
    prev: *mut Transport,
}

impl<'a> InCallback<'a> {
    fn enter(shared: &'a Shared, current: *mut Transport) -> Self {
        shared.depth.set(shared.depth.get() + 1);
        let prev = shared.current.replace(current);
        Self { shared, prev }
    }
}

impl Drop for InCallback<'_> {
    fn drop(&mut self) {
        self.shared.current.set(self.prev);
        self.shared.depth.set(self.shared.depth.get() - 1);
    }
}

impl Ringbtl {
    /// The transport, for one exported call.
    ///
    /// Inside a receive callback this is the `&mut Transport` the pass lent the handler
    /// (`current`); elsewhere no other reference to the transport is live: the exported
    /// functions release theirs before calling into C, and one thread drives the handle.
    // The handle is shared with the callbacks; the transport it holds is reached through
    // an `UnsafeCell` (or the lent pointer) under the single-driver rule above.
    #[allow(clippy::mut_from_ref)]
    fn transport(&self) -> &mut Transport {
        let cur = self.shared.current.get();
        if cur.is_null() {
            // SAFETY: no receive handler runs, so no `&mut Transport` is live (see above);
            // the returned reference is used for one library call and dropped before any
            // C code runs.
            unsafe { &mut *self.transport.get() }
        } else {
            // SAFETY: `cur` is the handler's `&mut Transport`, live for the whole C call
            // this function is called from (`InCallback` clears it after), and nothing else
            // uses it meanwhile.
            unsafe { &mut *cur }
        }
    }

    /// Delivers queued completions and failures to C; returns how many.
    fn deliver(&self) -> usize {
        let mut n = 0;
        loop {
            // The borrow ends before C runs: callbacks may send, which queues nothing
            // here, or progress, which returns at once.
            let Some(ev) = self.shared.events.borrow_mut().pop_front() else {
                return n;
            };
            n += 1;
            match ev {
                Ev::Done(c) => {
                    if let Some((f, ctx)) = self.shared.complete.get() {
                        let status = match &c.result {
                            Ok(()) => RINGBTL_OK,
                            Err(r) => fail_code(r),
                        };
                        let _cb = InCallback::enter(&self.shared, ptr::null_mut());
                        // SAFETY: a C function pointer the caller registered, called with
                        // the context it gave, on the driving thread.
                        unsafe { f(ctx, c.peer.0, c.cookie, status) };
                    }
                }
                Ev::Failed(peer, reason) => {
                    if let Some((f, ctx)) = self.shared.error.get() {
                        let msg = CString::new(reason.to_string().replace('\0', "\\0"))
                            .unwrap_or_default();
                        let _cb = InCallback::enter(&self.shared, ptr::null_mut());
                        // SAFETY: as above; `msg` outlives the call.
                        unsafe { f(ctx, peer.0, fail_code(&reason), msg.as_ptr()) };
                    }
                }
            }
        }
    }
}

/// The handler registered with the transport for every tag that has a C callback: it
/// looks the callback up at each message, so unregistering inside the callback (when the
/// transport has the handler taken out and puts it back after) still takes effect.
fn dispatcher(shared: Rc<Shared>) -> impl FnMut(&mut Transport, &ringbtl::Am<'_>) + 'static {
    move |t, am| {
        let Some((f, ctx)) = shared.recv[am.tag.0 as usize].get() else {
            return;
        };
        let _cb = InCallback::enter(&shared, t as *mut Transport);
        // SAFETY: a C function pointer the caller registered for this tag, called with its
        // context; the payload is valid for the call, as the header documents.
        unsafe {
            f(
                ctx,
                am.src.0,
                am.tag.0,
                am.payload.as_ptr().cast(),
                am.payload.len(),
            )
        };
    }
}

/// The resolver registered with the transport while a C resolver is set: it looks the
/// C function up at each call and lends the transport to the functions it calls (as the
/// receive dispatcher does), so that it may add the peer.
fn resolver(shared: Rc<Shared>) -> impl FnMut(&mut Transport, PeerId) -> bool + 'static {
    move |t, peer| {
        let Some((f, ctx)) = shared.resolve.get() else {
            return false;
        };
        let _cb = InCallback::enter(&shared, t as *mut Transport);
        // SAFETY: a C function pointer the caller registered, called with its context on
        // the driving thread; the transport it may reach is the one lent for this call.
        unsafe { f(ctx, peer.0) != 0 }
    }
}

/// The largest message `t` sends or accepts.
pub(crate) fn max_frame(t: &Transport) -> usize {
    t.config().core.max_frame as usize
}

/// Reads a handle argument.
///
/// # Safety
/// `t` is NULL or a live handle from `ringbtl_create`.
unsafe fn handle<'a>(t: *const Ringbtl) -> Option<&'a Ringbtl> {
    // SAFETY: the caller's contract; only shared references to the handle are made (its
    // mutable state is in cells).
    unsafe { t.as_ref() }
}

fn null_handle(func: &str) -> c_int {
    fail(RINGBTL_ERR_INVALID, format!("{func}: transport is NULL"))
}

/// Creates a transport from `cfg` (consumed in every case) into `*out`.
///
/// # Safety
/// `cfg` is NULL or from `ringbtl_config_new`, not freed; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_create(cfg: *mut RingbtlConfig, out: *mut *mut Ringbtl) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        if cfg.is_null() {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_create: cfg is NULL");
        }
        // SAFETY: `cfg` came from `Box::into_raw` in `ringbtl_config_new`; it is consumed
        // here exactly once (the caller's contract).
        let cfg = unsafe { Box::from_raw(cfg) }.cfg;
        if out.is_null() {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_create: out is NULL");
        }
        let mut t = match Transport::new(cfg) {
            Ok(t) => t,
            Err(e) => return fail_with(&e),
        };
        let shared = Rc::new(Shared {
            recv: std::array::from_fn(|_| Cell::new(None)),
            complete: Cell::new(None),
            error: Cell::new(None),
            resolve: Cell::new(None),
            events: RefCell::new(VecDeque::with_capacity(256)),
            current: Cell::new(ptr::null_mut()),
            depth: Cell::new(0),
        });
        let s = shared.clone();
        t.on_complete(move |c| s.events.borrow_mut().push_back(Ev::Done(c)));
        let s = shared.clone();
        t.on_error(move |p, r| s.events.borrow_mut().push_back(Ev::Failed(p, r.clone())));
        let Ok(uris) = CString::new(t.uris()) else {
            return fail(RINGBTL_ERR_INTERNAL, "URI list with a NUL byte");
        };
        let backend = match t.backend_name() {
            "uring" => c"uring",
            "epoll" => c"epoll",
            _ => c"unknown",
        };
        let h = Box::new(Ringbtl {
            local_id: t.local_id().0,
            max_frame: max_frame(&t),
            transport: UnsafeCell::new(t),
            shared,
            uris,
            backend,
        });
        // SAFETY: `out` is non-null and writable (the caller's contract).
        unsafe { out.write(Box::into_raw(h)) };
        RINGBTL_OK
    })
}

/// FIN to every peer, drains up to `timeout_ms`, runs the completions still pending,
/// closes and frees. NULL is fine; refused inside a callback.
///
/// # Safety
/// `t` is NULL or a live handle from `ringbtl_create`; it is invalid after a call that did
/// not return RINGBTL_ERR_INVALID.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_destroy(t: *mut Ringbtl, timeout_ms: u32) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return RINGBTL_OK;
        };
        if h.shared.depth.get() > 0 {
            return fail(
                RINGBTL_ERR_INVALID,
                "ringbtl_destroy may not be called from inside a callback",
            );
        }
        let r = h
            .transport()
            .shutdown(Duration::from_millis(timeout_ms.into()));
        h.deliver();
        // SAFETY: `t` came from `Box::into_raw` in `ringbtl_create`, is not used by any
        // callback (none runs: depth is 0) and is freed once (the caller's contract).
        drop(unsafe { Box::from_raw(t) });
        match r {
            Ok(()) => RINGBTL_OK,
            Err(e) => fail_with(&e),
        }
    })
}

/// The local URI list, owned by the handle.
///
/// # Safety
/// `t` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_uris(t: *const Ringbtl) -> *const c_char {
    // SAFETY: the caller's contract.
    match unsafe { handle(t) } {
        Some(h) => h.uris.as_ptr(),
        None => c"".as_ptr(),
    }
}

/// This process's id (0 for NULL).
///
/// # Safety
/// `t` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_local_id(t: *const Ringbtl) -> u32 {
    // SAFETY: the caller's contract.
    unsafe { handle(t) }.map_or(0, |h| h.local_id)
}

/// `"uring"` or `"epoll"` (`""` for NULL).
///
/// # Safety
/// `t` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_backend_name(t: *const Ringbtl) -> *const c_char {
    // SAFETY: the caller's contract.
    unsafe { handle(t) }.map_or(c"".as_ptr(), |h| h.backend.as_ptr())
}

/// Readies `t` to be waited for outside it: `RINGBTL_OK` with `*fd` a descriptor that
/// polls readable once the transport has something to collect, or -1 when it has
/// something already (progress now); `RINGBTL_ERR_INVALID` for NULL arguments or inside
/// a callback.
///
/// # Safety
/// `t` is NULL or a live handle; `fd` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_wait_fd(t: *mut Ringbtl, fd: *mut c_int) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        let (Some(h), false) = (unsafe { handle(t) }, fd.is_null()) else {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_wait_fd: NULL argument");
        };
        match h.transport().prepare_wait() {
            Ok(w) => {
                // SAFETY: `fd` is valid for a write (checked non-NULL; the caller's contract).
                unsafe { *fd = w.unwrap_or(-1) };
                RINGBTL_OK
            }
            Err(e) => fail_with(&e),
        }
    })
}

/// Largest message in bytes (0 for NULL).
///
/// # Safety
/// `t` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_max_frame(t: *const Ringbtl) -> usize {
    // SAFETY: the caller's contract.
    unsafe { handle(t) }.map_or(0, |h| h.max_frame)
}

/// Most iovecs per send.
#[no_mangle]
pub extern "C" fn ringbtl_max_segments() -> usize {
    MAX_SEGMENTS
}

/// Adds peer `peer` at the URI list it published.
///
/// # Safety
/// `t` is NULL or a live handle; `uris` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_add_peer(
    t: *mut Ringbtl,
    peer: u32,
    uris: *const c_char,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe { add_peer(t, peer, None, uris, "ringbtl_add_peer") }
}

/// Adds process `rank` of job `job` (added with `ringbtl_add_job`) at the URI list it
/// published; it goes by `peer` here.
///
/// # Safety
/// `t` is NULL or a live handle; `uris` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_add_peer_of_job(
    t: *mut Ringbtl,
    peer: u32,
    job: u64,
    rank: u32,
    uris: *const c_char,
) -> c_int {
    let of_job = Some((job, PeerId(rank)));
    // SAFETY: the caller's contract, passed on.
    unsafe { add_peer(t, peer, of_job, uris, "ringbtl_add_peer_of_job") }
}

/// # Safety
/// `t` is NULL or a live handle; `uris` is NULL or a NUL-terminated string.
unsafe fn add_peer(
    t: *mut Ringbtl,
    peer: u32,
    of_job: Option<(u64, PeerId)>,
    uris: *const c_char,
    name: &str,
) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return null_handle(name);
        };
        if uris.is_null() {
            return fail(RINGBTL_ERR_INVALID, format!("{name}: uris is NULL"));
        }
        // SAFETY: non-null and NUL-terminated (the caller's contract).
        let Ok(uris) = unsafe { CStr::from_ptr(uris) }.to_str() else {
            return fail(RINGBTL_ERR_INVALID, format!("{name}: uris is not UTF-8"));
        };
        // A list that does not parse is a bad argument; one that parses but that no
        // selected interface can reach makes the peer unreachable.
        if let Err(e) = parse_uri_list(uris) {
            return fail(RINGBTL_ERR_INVALID, e);
        }
        let added = match of_job {
            None => h.transport().add_peer_uris(PeerId(peer), uris),
            Some((job, rank)) => h
                .transport()
                .add_peer_of_job_uris(PeerId(peer), job, rank, uris),
        };
        match added {
            Ok(()) => RINGBTL_OK,
            Err(e @ Error::Wireup(_)) => fail(RINGBTL_ERR_UNREACHABLE, e),
            Err(e) => fail_with(&e),
        }
    })
}

/// Writes the public key of the transport's job into `out` as 64 hexadecimal digits and
/// a NUL: what another job needs (`ringbtl_add_job`) to talk to this one.
///
/// # Safety
/// `t` is NULL or a live handle; `out` is NULL or points to 65 writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_job_public_key(t: *mut Ringbtl, out: *mut c_char) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return null_handle("ringbtl_job_public_key");
        };
        if out.is_null() {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_job_public_key: out is NULL");
        }
        let hex = ringbtl::auth::key_to_hex(&h.transport().job_public_key());
        // SAFETY: `out` points to 65 writable bytes (the caller's contract).
        unsafe { write_hex(&hex, out) };
        RINGBTL_OK
    })
}

/// Lets the processes of job `job` (its token) connect, with the key of the two jobs
/// derived from this transport's job key and `public_hex`, that job's public key.
///
/// # Safety
/// `t` is NULL or a live handle; `public_hex` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_add_job(
    t: *mut Ringbtl,
    job: u64,
    public_hex: *const c_char,
) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return null_handle("ringbtl_add_job");
        };
        if public_hex.is_null() {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_add_job: key is NULL");
        }
        // SAFETY: non-null and NUL-terminated (the caller's contract).
        let parsed = unsafe { CStr::from_ptr(public_hex) }
            .to_str()
            .map_err(|_| "not UTF-8".to_string())
            .and_then(ringbtl::auth::key_from_hex);
        let public = match parsed {
            Ok(k) => k,
            Err(e) => return fail(RINGBTL_ERR_INVALID, format!("ringbtl_add_job: {e}")),
        };
        match h.transport().add_job(job, &public) {
            Ok(()) => RINGBTL_OK,
            Err(e) => fail(RINGBTL_ERR_INVALID, format!("ringbtl_add_job: {e}")),
        }
    })
}

/// Sets the receive callback of `tag`.
///
/// # Safety
/// `t` is NULL or a live handle; `f` is NULL or a function callable with `ctx` until it is
/// unregistered or the handle destroyed.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_register(
    t: *mut Ringbtl,
    tag: u8,
    f: RecvFn,
    ctx: *mut c_void,
) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return null_handle("ringbtl_register");
        };
        let Some(f) = f else {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_register: callback is NULL");
        };
        let slot = &h.shared.recv[tag as usize];
        if slot.get().is_some() {
            return fail_with(&Error::TagInUse(Tag(tag)));
        }
        // The transport may still hold the dispatcher from an earlier registration (put
        // back after a callback that unregistered itself): then it serves again.
        match h
            .transport()
            .register(Tag(tag), dispatcher(h.shared.clone()))
        {
            Ok(()) | Err(Error::TagInUse(_)) => {
                slot.set(Some((f, ctx)));
                RINGBTL_OK
            }
            Err(e) => fail_with(&e),
        }
    })
}

/// Removes the receive callback of `tag` (allowed inside that callback).
///
/// # Safety
/// `t` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_unregister(t: *mut Ringbtl, tag: u8) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return null_handle("ringbtl_unregister");
        };
        if h.shared.recv[tag as usize].take().is_none() {
            return fail(
                RINGBTL_ERR_INVALID,
                format!("ringbtl_unregister: tag {tag} has no callback"),
            );
        }
        h.transport().unregister(Tag(tag));
        RINGBTL_OK
    })
}

/// Sets (or with NULL clears) the completion callback.
///
/// # Safety
/// `t` is NULL or a live handle; `f` is NULL or callable with `ctx` while set.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_on_complete(t: *mut Ringbtl, f: CompleteFn, ctx: *mut c_void) {
    guard((), || {
        // SAFETY: the caller's contract.
        if let Some(h) = unsafe { handle(t) } {
            h.shared.complete.set(f.map(|f| (f, ctx)));
        }
    })
}

/// Sets (or with NULL clears) the peer-failure callback.
///
/// # Safety
/// `t` is NULL or a live handle; `f` is NULL or callable with `ctx` while set.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_on_error(t: *mut Ringbtl, f: ErrorFn, ctx: *mut c_void) {
    guard((), || {
        // SAFETY: the caller's contract.
        if let Some(h) = unsafe { handle(t) } {
            h.shared.error.set(f.map(|f| (f, ctx)));
        }
    })
}

/// Writes a fresh job key from the operating system's random source into `out` as 64
/// hexadecimal digits and a NUL.
///
/// # Safety
/// `out` is NULL or points to 65 writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_generate_job_key(out: *mut c_char) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        if out.is_null() {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_generate_job_key: out is NULL");
        }
        let key = match ringbtl::auth::JobKey::generate() {
            Ok(k) => k,
            Err(e) => return fail_with(&e),
        };
        // SAFETY: `out` points to 65 writable bytes (the caller's contract).
        unsafe { write_hex(&key.to_hex(), out) };
        RINGBTL_OK
    })
}

/// Writes a key's 64 hexadecimal digits and a NUL.
///
/// # Safety
/// `out` points to 65 writable bytes.
unsafe fn write_hex(hex: &str, out: *mut c_char) {
    debug_assert_eq!(hex.len(), 64);
    // SAFETY: `out` points to 65 writable bytes (the caller's contract); `hex` holds 64
    // ASCII bytes, then the NUL.
    unsafe {
        ptr::copy_nonoverlapping(hex.as_ptr().cast::<c_char>(), out, hex.len());
        out.add(hex.len()).write(0);
    }
}

/// Sets the job key of a live transport (64 hexadecimal digits), for a key that arrives
/// after creation (from a launcher's key-value store), before the first connection.
///
/// # Safety
/// `t` is NULL or a live handle; `hex` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_set_job_key(t: *mut Ringbtl, hex: *const c_char) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return null_handle("ringbtl_set_job_key");
        };
        if hex.is_null() {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_set_job_key: key is NULL");
        }
        // SAFETY: non-null and NUL-terminated (the caller's contract).
        let Ok(text) = unsafe { CStr::from_ptr(hex) }.to_str() else {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_set_job_key: key is not UTF-8");
        };
        match ringbtl::auth::JobKey::from_hex(text) {
            Ok(k) => {
                h.transport().set_job_key(k);
                RINGBTL_OK
            }
            Err(e) => fail(RINGBTL_ERR_INVALID, format!("ringbtl_set_job_key: {e}")),
        }
    })
}

/// Sets (or with NULL clears) the resolver of processes that connect without having been
/// added (lazy add of peers).
///
/// # Safety
/// `t` is NULL or a live handle; `f` is NULL or callable with `ctx` while set.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_on_unknown_peer(t: *mut Ringbtl, f: ResolveFn, ctx: *mut c_void) {
    guard((), || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return;
        };
        let was_set = h.shared.resolve.replace(f.map(|f| (f, ctx))).is_some();
        match (f.is_some(), was_set) {
            (true, false) => h.transport().on_unknown_peer(resolver(h.shared.clone())),
            (false, true) => h.transport().clear_unknown_peer(),
            // The transport's resolver looks the C function up at each call.
            _ => {}
        }
    })
}

/// Queues the concatenation of `iov[0..iovcnt]` for `peer`, without copying large
/// segments; exactly one completion with `cookie` follows when it returns RINGBTL_OK.
///
/// # Safety
/// `t` is NULL or a live handle; `iov` is NULL (with `iovcnt` 0) or points to `iovcnt`
/// elements whose `base` points to `len` readable bytes that stay valid and unchanged
/// until the completion callback for `cookie` has run.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_send(
    t: *mut Ringbtl,
    peer: u32,
    tag: u8,
    iov: *const RingbtlIov,
    iovcnt: usize,
    cookie: u64,
) -> c_int {
    // SAFETY: the caller's contract is `queue`'s.
    unsafe {
        queue("ringbtl_send", t, iov, iovcnt, |tr, segs| {
            tr.send(PeerId(peer), Tag(tag), segs, cookie)
        })
    }
}

/// Queues a put of the concatenation of `iov[0..iovcnt]` to `addr` in the region `key`
/// that `peer` registered; exactly one completion with `cookie` follows when it returns
/// RINGBTL_OK.
///
/// # Safety
/// As [`ringbtl_send`].
#[no_mangle]
pub unsafe extern "C" fn ringbtl_put(
    t: *mut Ringbtl,
    peer: u32,
    key: u64,
    addr: u64,
    iov: *const RingbtlIov,
    iovcnt: usize,
    cookie: u64,
) -> c_int {
    let target = PutTarget { key, addr };
    // SAFETY: the caller's contract is `queue`'s.
    unsafe {
        queue("ringbtl_put", t, iov, iovcnt, |tr, segs| {
            tr.put(PeerId(peer), target, segs, cookie)
        })
    }
}

/// Queues a get of `len` bytes at `addr` in the readable region `key` that `peer`
/// registered, to land at `local_addr` in our region `local_key`; exactly one completion
/// with `cookie` follows when it returns RINGBTL_OK (once the bytes are in place).
///
/// # Safety
/// `t` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_get(
    t: *mut Ringbtl,
    peer: u32,
    key: u64,
    addr: u64,
    len: u32,
    local_key: u64,
    local_addr: u64,
    cookie: u64,
) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return null_handle("ringbtl_get");
        };
        let (from, to) = (
            PutTarget { key, addr },
            PutTarget {
                key: local_key,
                addr: local_addr,
            },
        );
        match h.transport().get(PeerId(peer), from, len, to, cookie) {
            Ok(()) => RINGBTL_OK,
            Err(e) => fail(send_code(&e), e),
        }
    })
}

/// The body of [`ringbtl_send`] and [`ringbtl_put`] (`what`): checks the handle and the
/// gather list, hands the segments to `op` and turns its answer into a status code.
///
/// # Safety
/// As [`ringbtl_send`].
unsafe fn queue(
    what: &str,
    t: *mut Ringbtl,
    iov: *const RingbtlIov,
    iovcnt: usize,
    op: impl FnOnce(&mut Transport, &[Bytes]) -> Result<(), SendError>,
) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return null_handle(what);
        };
        let mut segs: [Bytes; MAX_SEGMENTS] = Default::default();
        // SAFETY: the caller's contract is `segments`'.
        if let Err(code) = unsafe { segments(what, iov, iovcnt, &mut segs) } {
            return code;
        }
        match op(h.transport(), &segs[..iovcnt]) {
            Ok(()) => RINGBTL_OK,
            Err(e) => fail(send_code(&e), e),
        }
    })
}

/// `ringbtl_register_region` flag: peers may write into the region (`ringbtl_put`).
pub const RINGBTL_REGION_PEER_WRITE: u32 = 1;
/// `ringbtl_register_region` flag: peers may read the region (`ringbtl_get`).
pub const RINGBTL_REGION_PEER_READ: u32 = 2;

/// Registers `len` bytes at `base` that peers may put into (`RINGBTL_REGION_PEER_WRITE`
/// in `flags`) or get from (`RINGBTL_REGION_PEER_READ`), or neither (flags 0: only the
/// replies of our own gets land there); the key goes to `*key`.
///
/// # Safety
/// `t` is NULL or a live handle; `key` is NULL or writable; `base` points to `len`
/// writable bytes that stay valid, and that nothing else reads or writes while a put may
/// land there (nor writes while a get may read them), until `ringbtl_deregister_region`
/// returns RINGBTL_OK for the key or the transport is destroyed.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_register_region(
    t: *mut Ringbtl,
    base: *mut c_void,
    len: usize,
    flags: u32,
    key: *mut u64,
) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return null_handle("ringbtl_register_region");
        };
        let Some(base) = NonNull::new(base.cast::<u8>()) else {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_register_region: base is NULL");
        };
        if key.is_null() {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_register_region: key is NULL");
        }
        let access = match flags {
            0 => RegionAccess::Local,
            RINGBTL_REGION_PEER_WRITE => RegionAccess::Write,
            RINGBTL_REGION_PEER_READ => RegionAccess::Read,
            3 => RegionAccess::ReadWrite,
            f => {
                return fail(
                    RINGBTL_ERR_INVALID,
                    format!("ringbtl_register_region: unknown flags {f:#x}"),
                )
            }
        };
        // SAFETY: the memory's contract is the caller's (above), word for word the
        // transport's.
        let k = unsafe { h.transport().register_region(base, len, access) };
        // SAFETY: `key` is non-null and writable (the caller's contract).
        unsafe { key.write(k) };
        RINGBTL_OK
    })
}

/// Takes a region back: RINGBTL_ERR_INVALID for a key that names none, RINGBTL_ERR_BUSY
/// while a put (or a get's reply) is being received into it or a reply read from it is
/// being sent.
///
/// # Safety
/// `t` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_deregister_region(t: *mut Ringbtl, key: u64) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return null_handle("ringbtl_deregister_region");
        };
        match h.transport().deregister_region(key) {
            Ok(()) => RINGBTL_OK,
            Err(e @ RegionError::InUse(_)) => fail(RINGBTL_ERR_BUSY, e),
            Err(e) => fail(RINGBTL_ERR_INVALID, e),
        }
    })
}

/// Turns a C gather list into segments over the caller's memory, without copying.
///
/// # Safety
/// `iov` is NULL (with `iovcnt` 0) or points to `iovcnt` elements whose `base` points to
/// `len` readable bytes that stay valid and unchanged until the completion of the
/// operation the segments are given to has run.
unsafe fn segments(
    what: &str,
    iov: *const RingbtlIov,
    iovcnt: usize,
    segs: &mut [Bytes; MAX_SEGMENTS],
) -> Result<(), c_int> {
    if iovcnt > MAX_SEGMENTS {
        let e = SendError::TooManySegments {
            got: iovcnt,
            max: MAX_SEGMENTS,
        };
        return Err(fail(send_code(&e), e));
    }
    if iov.is_null() && iovcnt > 0 {
        return Err(fail(RINGBTL_ERR_INVALID, format!("{what}: iov is NULL")));
    }
    let iovs: &[RingbtlIov] = if iovcnt == 0 {
        &[]
    } else {
        // SAFETY: `iov` is non-null and points to `iovcnt` elements (the caller's
        // contract); they are read during this call only.
        unsafe { std::slice::from_raw_parts(iov, iovcnt) }
    };
    for (s, v) in segs.iter_mut().zip(iovs) {
        if v.len == 0 {
            continue;
        }
        if v.base.is_null() {
            return Err(fail(
                RINGBTL_ERR_INVALID,
                format!("{what}: NULL base with a length"),
            ));
        }
        // SAFETY: `base` points to `len` readable bytes that stay valid and unchanged
        // until the completion for `cookie` has run (the caller's contract). A static
        // `Bytes` never frees, so dropping it early or late cannot touch the caller's
        // memory; and the library runs the completion of a send only after the kernel
        // handed back the batch that carries it (a batch rented to the kernel when its
        // peer fails completes when it comes back), so no read of the bytes happens
        // after the completion.
        let bytes: &'static [u8] = unsafe { std::slice::from_raw_parts(v.base.cast(), v.len) };
        *s = Bytes::from_static(bytes);
    }
    Ok(())
}

/// Hands every queued send to the kernel now; runs no callback.
///
/// # Safety
/// `t` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_flush(t: *mut Ringbtl) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return null_handle("ringbtl_flush");
        };
        match h.transport().flush() {
            Ok(()) => RINGBTL_OK,
            Err(e) => fail_with(&e),
        }
    })
}

/// One non-blocking pass; inside a callback, 0 and nothing done.
///
/// # Safety
/// `t` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_progress(t: *mut Ringbtl) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { pass(t, "ringbtl_progress", None) }
}

/// Like `ringbtl_progress`, but may sleep in the kernel up to `timeout_us`.
///
/// # Safety
/// `t` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_wait(t: *mut Ringbtl, timeout_us: u32) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        pass(
            t,
            "ringbtl_wait",
            Some(Duration::from_micros(timeout_us.into())),
        )
    }
}

/// What happened to the links of every peer so far (see
/// [`Stats`](ringbtl::Stats)): links joined, links lost while their peer stayed
/// connected, failovers to a standby link, and of those the ones started because the
/// primary connection stopped acknowledging.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RingbtlLinkStats {
    /// Links beyond a peer's first connection that completed their handshake.
    pub joined: u64,
    /// Open links lost while their peer stayed connected (each is dialed again).
    pub lost: u64,
    /// Times a peer's stream moved to a standby link, losing nothing.
    pub failovers: u64,
    /// Of those, the ones started because the primary's retransmissions went unanswered.
    pub stalls: u64,
}

/// Connections open to `peer`: its first and its links (0 when it is not connected, is
/// unknown, or `t` is NULL).
///
/// # Safety
/// `t` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_links_open(t: *const Ringbtl, peer: u32) -> usize {
    guard(0, || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return 0;
        };
        h.transport().links_open(PeerId(peer))
    })
}

/// Writes the link counters of `t` into `*out`: `RINGBTL_OK`, or `RINGBTL_ERR_INVALID`
/// for a NULL argument.
///
/// # Safety
/// `t` is NULL or a live handle; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_link_stats(
    t: *const Ringbtl,
    out: *mut RingbtlLinkStats,
) -> c_int {
    guard(RINGBTL_ERR_INVALID, || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_link_stats: NULL transport");
        };
        if out.is_null() {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_link_stats: NULL out");
        }
        let s = h.transport().stats();
        let v = RingbtlLinkStats {
            joined: s.links_joined,
            lost: s.links_lost,
            failovers: s.failovers,
            stalls: s.stalls,
        };
        // SAFETY: `out` is non-NULL and valid for a write (the caller's contract).
        unsafe { out.write(v) };
        RINGBTL_OK
    })
}

/// Sends accepted for `peer` whose completion has not run yet.
///
/// # Safety
/// `t` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_pending(t: *const Ringbtl, peer: u32) -> usize {
    guard(0, || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return 0;
        };
        let queued = h
            .shared
            .events
            .borrow()
            .iter()
            .filter(|e| matches!(e, Ev::Done(c) if c.peer.0 == peer))
            .count();
        h.transport().pending(PeerId(peer)) + queued
    })
}

/// The body of `ringbtl_progress` (`timeout` None) and `ringbtl_wait`.
///
/// # Safety
/// `t` is NULL or a live handle.
unsafe fn pass(t: *mut Ringbtl, func: &str, timeout: Option<Duration>) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        let Some(h) = (unsafe { handle(t) }) else {
            return null_handle(func);
        };
        if h.shared.depth.get() > 0 {
            // Re-entrant call from a callback: the outer pass continues.
            return 0;
        }
        let r = match timeout {
            None => h.transport().progress(),
            Some(d) => h.transport().wait(d),
        };
        let delivered = h.deliver();
        match r {
            Ok(n) => (n + delivered).min(c_int::MAX as usize) as c_int,
            Err(Error::Reentrant(_)) => 0,
            Err(e) => fail_with(&e),
        }
    })
}
