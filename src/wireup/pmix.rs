//! Address exchange through PMIx (Open MPI's `mpirun`, `prterun`, `srun --mpi=pmix`), with
//! the system `libpmix` (cargo feature `pmix`).
//!
//! The client library talks to the PMIx server of the launcher's daemon on this node
//! (found through `PMIX_SERVER_URI*` in the environment). The exchange is the one MPI
//! libraries do at start-up: `PMIx_Put` of this rank's URI list with global scope,
//! `PMIx_Commit`, a `PMIx_Fence` over the namespace that collects the data, then one
//! `PMIx_Get` per rank, answered from the local copy the fence brought.
//!
//! The bindings are written by hand for the few calls used, against the PMIx 4 headers
//! (`pmix_common.h`): `pmix_proc_t` is `{char nspace[256]; uint32_t rank}` (260 bytes),
//! `pmix_value_t` is a `uint16_t` type followed by an 8-aligned 24-byte union (32 bytes),
//! `pmix_info_t` is `{char key[512]; uint32_t flags; pmix_value_t value}` (552 bytes,
//! `value` at 520). The sizes are checked at compile time below.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, CStr, CString};
use std::mem::{align_of, size_of};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Modex;
use crate::error::Error;

/// `PMIX_MAX_NSLEN + 1`.
const NSPACE_LEN: usize = 256;
/// `PMIX_MAX_KEYLEN + 1`.
const KEY_LEN: usize = 512;
const PMIX_SUCCESS: c_int = 0;
const PMIX_BOOL: u16 = 1;
const PMIX_STRING: u16 = 3;
const PMIX_INT: u16 = 6;
const PMIX_UINT32: u16 = 14;
/// `pmix_scope_t` value: share with every process of the job, on every node.
const PMIX_GLOBAL: u8 = 3;
/// `PMIX_RANK_WILDCARD`: the whole namespace.
const PMIX_RANK_WILDCARD: u32 = u32::MAX - 1;
const PMIX_JOB_SIZE: &CStr = c"pmix.job.size";
const PMIX_COLLECT_DATA: &CStr = c"pmix.collect";
const PMIX_TIMEOUT: &CStr = c"pmix.timeout";

/// `pmix_proc_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Proc {
    nspace: [c_char; NSPACE_LEN],
    rank: u32,
}

/// The data union of `pmix_value_t`: only the members used here, padded to its size.
#[repr(C)]
#[derive(Clone, Copy)]
union ValueData {
    flag: bool,
    integer: c_int,
    uint32: u32,
    string: *mut c_char,
    _size: [u64; 3],
}

/// `pmix_value_t`.
#[repr(C)]
struct Value {
    kind: u16,
    data: ValueData,
}

/// `pmix_info_t`.
#[repr(C)]
struct Info {
    key: [c_char; KEY_LEN],
    flags: u32,
    value: Value,
}

const _: () = assert!(size_of::<Proc>() == 260);
const _: () = assert!(size_of::<Value>() == 32 && align_of::<Value>() == 8);
const _: () = assert!(size_of::<Info>() == 552 && std::mem::offset_of!(Info, value) == 520);

#[link(name = "pmix")]
extern "C" {
    fn PMIx_Init(proc_: *mut Proc, info: *mut Info, ninfo: usize) -> c_int;
    fn PMIx_Finalize(info: *const Info, ninfo: usize) -> c_int;
    fn PMIx_Put(scope: u8, key: *const c_char, val: *mut Value) -> c_int;
    fn PMIx_Commit() -> c_int;
    fn PMIx_Fence(procs: *const Proc, nprocs: usize, info: *const Info, ninfo: usize) -> c_int;
    fn PMIx_Get(
        proc_: *const Proc,
        key: *const c_char,
        info: *const Info,
        ninfo: usize,
        val: *mut *mut Value,
    ) -> c_int;
    fn PMIx_Value_destruct(val: *mut Value);
    fn PMIx_Error_string(status: c_int) -> *const c_char;
}

/// Set while a [`PmixModex`] exists: the PMIx client is one per process.
static ACTIVE: AtomicBool = AtomicBool::new(false);

fn status_text(rc: c_int) -> String {
    // SAFETY: PMIx_Error_string accepts any status and returns a pointer to a static,
    // NUL-terminated string (or NULL, checked), valid for the life of the process.
    let p = unsafe { PMIx_Error_string(rc) };
    if p.is_null() {
        return format!("PMIx status {rc}");
    }
    // SAFETY: non-null, NUL-terminated and static, as above.
    let s = unsafe { CStr::from_ptr(p) };
    format!("{} ({rc})", s.to_string_lossy())
}

fn check(what: &str, rc: c_int) -> Result<(), Error> {
    if rc == PMIX_SUCCESS {
        Ok(())
    } else {
        Err(Error::Wireup(format!("{what}: {}", status_text(rc))))
    }
}

fn info(key: &CStr, kind: u16, data: ValueData) -> Info {
    let mut i = Info {
        key: [0; KEY_LEN],
        flags: 0,
        value: Value { kind, data },
    };
    for (d, &s) in i.key.iter_mut().zip(key.to_bytes()) {
        *d = s as c_char;
    }
    i
}

/// A value returned by `PMIx_Get`, released with the library's destructor and `free`.
struct Owned(*mut Value);

impl Drop for Owned {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the pointer came from a successful PMIx_Get, which allocates it with
            // malloc (pmix_malloc); it is destructed and freed exactly once, here.
            unsafe {
                PMIx_Value_destruct(self.0);
                libc::free(self.0.cast());
            }
        }
    }
}

/// The PMIx exchange: one per process, finalized on [`Modex::finalize`] or drop.
pub struct PmixModex {
    me: Proc,
    size: u32,
    timeout: Duration,
    epoch: u32,
    live: bool,
}

impl std::fmt::Debug for PmixModex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PmixModex")
            .field("nspace", &self.nspace())
            .field("rank", &self.me.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl PmixModex {
    /// Connects to the local PMIx server (`PMIx_Init`) and reads this process's
    /// namespace, rank and the job size. `timeout` bounds each fence.
    pub fn init(timeout: Duration) -> Result<Self, Error> {
        if ACTIVE.swap(true, Ordering::AcqRel) {
            return Err(Error::Wireup(
                "a PMIx exchange already exists in this process".into(),
            ));
        }
        let mut me = Proc {
            nspace: [0; NSPACE_LEN],
            rank: 0,
        };
        // SAFETY: `me` is a valid, writable pmix_proc_t (layout checked above); no info
        // array is passed (NULL, 0), which the API allows.
        let rc = unsafe { PMIx_Init(&mut me, ptr::null_mut(), 0) };
        if rc != PMIX_SUCCESS {
            ACTIVE.store(false, Ordering::Release);
            return Err(Error::Wireup(format!(
                "PMIx_Init (is this process running under a PMIx launcher?): {}",
                status_text(rc)
            )));
        }
        let mut m = Self {
            me,
            size: 0,
            timeout,
            epoch: 0,
            live: true,
        };
        let wild = Proc {
            rank: PMIX_RANK_WILDCARD,
            ..me
        };
        let v = m.get(&wild, PMIX_JOB_SIZE)?;
        // SAFETY: `v.0` is non-null after a successful get and points to a pmix_value_t
        // that `v` owns; the union member read matches the type tag checked first.
        let size = unsafe {
            match (*v.0).kind {
                PMIX_UINT32 => Some((*v.0).data.uint32),
                PMIX_INT => u32::try_from((*v.0).data.integer).ok(),
                _ => None,
            }
        };
        m.size = match size {
            Some(n) if n > m.me.rank => n,
            _ => {
                return Err(Error::Wireup(format!(
                    "PMIx: {} has an unexpected type or value for rank {}",
                    PMIX_JOB_SIZE.to_string_lossy(),
                    m.me.rank
                )))
            }
        };
        Ok(m)
    }

    /// The job's namespace.
    pub fn nspace(&self) -> String {
        let bytes: Vec<u8> = self
            .me
            .nspace
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn get(&self, who: &Proc, key: &CStr) -> Result<Owned, Error> {
        let mut out: *mut Value = ptr::null_mut();
        // SAFETY: `who` and `key` are valid for the call (a pmix_proc_t and a
        // NUL-terminated string); no info array; `out` is a valid out-pointer that the
        // library sets to a malloc'd value on success, then owned by `Owned`.
        let rc = unsafe { PMIx_Get(who, key.as_ptr(), ptr::null(), 0, &mut out) };
        let owned = Owned(out);
        check(&format!("PMIx_Get({})", key.to_string_lossy()), rc)?;
        if owned.0.is_null() {
            return Err(Error::Wireup(format!(
                "PMIx_Get({}) returned no value",
                key.to_string_lossy()
            )));
        }
        Ok(owned)
    }
}

impl Modex for PmixModex {
    fn exchange(&mut self, my_uris: &str) -> Result<Vec<String>, Error> {
        if !self.live {
            return Err(Error::Wireup("PMIx already finalized".into()));
        }
        let key = CString::new(format!("ringbtl.uris.{}", self.epoch))
            .map_err(|_| Error::Wireup("PMIx key with a NUL byte".into()))?;
        self.epoch += 1;
        let val =
            CString::new(my_uris).map_err(|_| Error::Wireup("URI list with a NUL byte".into()))?;
        let mut v = Value {
            kind: PMIX_STRING,
            data: ValueData {
                string: val.as_ptr().cast_mut(),
            },
        };
        // SAFETY: `key` and the string in `v` are NUL-terminated and outlive the call;
        // PMIx_Put copies the value (it does not keep or free our pointer).
        check("PMIx_Put", unsafe {
            PMIx_Put(PMIX_GLOBAL, key.as_ptr(), &mut v)
        })?;
        // SAFETY: no arguments; the client is initialized (`live`).
        check("PMIx_Commit", unsafe { PMIx_Commit() })?;
        let all = Proc {
            rank: PMIX_RANK_WILDCARD,
            ..self.me
        };
        let secs = c_int::try_from(self.timeout.as_secs().max(1)).unwrap_or(c_int::MAX);
        let infos = [
            info(PMIX_COLLECT_DATA, PMIX_BOOL, ValueData { flag: true }),
            info(PMIX_TIMEOUT, PMIX_INT, ValueData { integer: secs }),
        ];
        // SAFETY: one valid pmix_proc_t (the whole namespace) and two initialized
        // pmix_info_t (layout checked above) that live across the blocking call.
        let rc = unsafe { PMIx_Fence(&all, 1, infos.as_ptr(), infos.len()) };
        check(
            &format!(
                "PMIx_Fence over {} ranks (a rank missing or late past {}s; PMIx does not \
                 say which)",
                self.size, secs
            ),
            rc,
        )?;
        (0..self.size)
            .map(|r| {
                let who = Proc { rank: r, ..self.me };
                let v = self
                    .get(&who, &key)
                    .map_err(|e| Error::Wireup(format!("addresses of rank {r}: {e}")))?;
                // SAFETY: `v.0` is non-null and owned by `v`; the string member is read
                // only when the type tag says PMIX_STRING, and is then NUL-terminated
                // (or NULL, checked) and valid until `v` drops, after the copy.
                unsafe {
                    let val = &*v.0;
                    if val.kind != PMIX_STRING || val.data.string.is_null() {
                        return Err(Error::Wireup(format!(
                            "addresses of rank {r}: PMIx value of type {} instead of a string",
                            val.kind
                        )));
                    }
                    Ok(CStr::from_ptr(val.data.string)
                        .to_string_lossy()
                        .into_owned())
                }
            })
            .collect()
    }

    fn rank(&self) -> u32 {
        self.me.rank
    }

    fn size(&self) -> u32 {
        self.size
    }

    fn finalize(&mut self) -> Result<(), Error> {
        if !std::mem::replace(&mut self.live, false) {
            return Ok(());
        }
        // SAFETY: called once per successful PMIx_Init (guarded by `live`); no info.
        let rc = unsafe { PMIx_Finalize(ptr::null(), 0) };
        ACTIVE.store(false, Ordering::Release);
        check("PMIx_Finalize", rc)
    }
}

impl Drop for PmixModex {
    fn drop(&mut self) {
        if let Err(e) = self.finalize() {
            tracing::warn!("{e}");
        }
    }
}
