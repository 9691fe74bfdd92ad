//! Address exchange through PMIx (Open MPI's `mpirun`, `prterun`, `srun --mpi=pmix`), with
//! the system's PMIx client library loaded at run time.
//!
//! The client library talks to the PMIx server of the launcher's daemon on this node
//! (found through `PMIX_SERVER_URI*` in the environment). The exchange is the one MPI
//! libraries do at start-up: `PMIx_Put` of this rank's URI list with global scope,
//! `PMIx_Commit`, a `PMIx_Fence` over the namespace that collects the data, then the
//! value of every rank, answered from the local copy the fence brought. Those are asked
//! all at once (`PMIx_Get_nb`, one answer callback each) and awaited together: the client
//! library answers each request on its own progress thread, so one blocking `PMIx_Get`
//! per rank costs two thread switches per rank, which on an oversubscribed node adds up
//! to tens of milliseconds per rank and leaves ranks that far behind the others when the
//! connections start.
//!
//! **Finding the library.** Nothing is linked at build time: a plain build runs under
//! every launcher. The first exchange opens `libpmix.so.2` (the runtime library, Debian:
//! `libpmix2`, which Open MPI and Slurm's PMIx plugin pull in), else `libpmix.so`, with
//! `dlopen(RTLD_NOW | RTLD_GLOBAL)` so that PMIx's own plugins find its symbols.
//! `RINGBTL_PMIX_LIB` names another file or path instead (a PMIx built under `/opt`).
//! A library that cannot be opened, or lacks one of the calls used, is an error that says
//! what was tried and how to fix it; it is not a crash. A library once opened stays
//! loaded for the life of the process (PMIx keeps threads and plugins that must not
//! outlive it).
//!
//! The bindings are written by hand for the few calls used, against the PMIx 4 headers
//! (`pmix_common.h`): `pmix_proc_t` is `{char nspace[256]; uint32_t rank}` (260 bytes),
//! `pmix_value_t` is a `uint16_t` type followed by an 8-aligned 24-byte union (32 bytes),
//! `pmix_info_t` is `{char key[512]; uint32_t flags; pmix_value_t value}` (552 bytes,
//! `value` at 520). The sizes are checked at compile time below; the unit tests check them
//! and the constants against the installed headers when a C compiler and the headers
//! (Debian: `libpmix-dev`) are there.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::mem::{align_of, size_of};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use super::Modex;
use crate::auth::JobKey;
use crate::error::Error;

/// The variable that names the PMIx client library to open instead of the defaults.
pub const LIB_VAR: &str = "RINGBTL_PMIX_LIB";
/// The libraries tried in order when [`LIB_VAR`] is not set.
pub const DEFAULT_LIBS: [&str; 2] = ["libpmix.so.2", "libpmix.so"];

/// `PMIX_MAX_NSLEN + 1`.
const NSPACE_LEN: usize = 256;
/// `PMIX_MAX_KEYLEN + 1`.
const KEY_LEN: usize = 512;
const PMIX_SUCCESS: c_int = 0;
/// `PMIX_ERR_NOT_FOUND`.
const PMIX_ERR_NOT_FOUND: c_int = -46;
/// `PMIX_ERR_TYPE_MISMATCH`.
const PMIX_ERR_TYPE_MISMATCH: c_int = -18;
const PMIX_BOOL: u16 = 1;
const PMIX_STRING: u16 = 3;
const PMIX_INT: u16 = 6;
const PMIX_UINT32: u16 = 14;
/// `pmix_scope_t` value: share with every process of the job, on every node.
const PMIX_GLOBAL: u8 = 3;
/// `PMIX_RANK_WILDCARD`: the whole namespace.
const PMIX_RANK_WILDCARD: u32 = u32::MAX - 1;
const PMIX_JOB_SIZE: &CStr = c"pmix.job.size";
/// Where rank 0 publishes the job key (64 hex digits).
const JOB_KEY: &CStr = c"ringbtl.jobkey";
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

/// The calls used, resolved from the opened library (`pmix.h` prototypes).
struct Api {
    /// What was opened (a name from [`DEFAULT_LIBS`] or the value of [`LIB_VAR`]).
    name: String,
    init: unsafe extern "C" fn(proc_: *mut Proc, info: *mut Info, ninfo: usize) -> c_int,
    finalize: unsafe extern "C" fn(info: *const Info, ninfo: usize) -> c_int,
    put: unsafe extern "C" fn(scope: u8, key: *const c_char, val: *mut Value) -> c_int,
    commit: unsafe extern "C" fn() -> c_int,
    fence: unsafe extern "C" fn(
        procs: *const Proc,
        nprocs: usize,
        info: *const Info,
        ninfo: usize,
    ) -> c_int,
    get: unsafe extern "C" fn(
        proc_: *const Proc,
        key: *const c_char,
        info: *const Info,
        ninfo: usize,
        val: *mut *mut Value,
    ) -> c_int,
    get_nb: unsafe extern "C" fn(
        proc_: *const Proc,
        key: *const c_char,
        info: *const Info,
        ninfo: usize,
        cbfunc: ValueCb,
        cbdata: *mut c_void,
    ) -> c_int,
    value_destruct: unsafe extern "C" fn(val: *mut Value),
    error_string: unsafe extern "C" fn(status: c_int) -> *const c_char,
    /// Keeps the function pointers above valid; never closed (see the module docs).
    _lib: Library,
}

/// `pmix_value_cbfunc_t`: the answer to a `PMIx_Get_nb`; `kv` belongs to the library and
/// is valid during the call only.
type ValueCb = unsafe extern "C" fn(status: c_int, kv: *mut Value, cbdata: *mut c_void);

/// The answers to a batch of `PMIx_Get_nb` requests: how many came, and one slot per
/// request (`None` until answered, then the string or the PMIx status).
type Got = (usize, Vec<Option<Result<String, c_int>>>);

/// The answers to a batch of `PMIx_Get_nb` requests, and the signal that all came.
struct Answers {
    got: Mutex<Got>,
    all: Condvar,
}

/// The `cbdata` of one request: where its answer goes. Freed by the caller once every
/// answer came, leaked if the wait ran out of time (an answer may still come).
struct Request {
    answers: Arc<Answers>,
    index: usize,
}

/// The answer callback of [`PmixModex::get_strs`]: copies the string out and counts the
/// answer. Runs on the library's progress thread (or within `PMIx_Get_nb`).
unsafe extern "C" fn string_answer(status: c_int, kv: *mut Value, cbdata: *mut c_void) {
    // SAFETY: `cbdata` is the `Request` passed with this request, kept alive until every
    // answer came (or leaked); the library calls back once per request.
    let req = unsafe { &*cbdata.cast::<Request>() };
    let answer = if status != PMIX_SUCCESS {
        Err(status)
    } else if kv.is_null() {
        Err(PMIX_ERR_NOT_FOUND)
    } else {
        // SAFETY: `kv` is a valid pmix_value_t during the call; the string member is read
        // only under the PMIX_STRING tag, and is then NUL-terminated or NULL (checked);
        // it is copied before returning.
        unsafe {
            let v = &*kv;
            if v.kind == PMIX_STRING && !v.data.string.is_null() {
                Ok(CStr::from_ptr(v.data.string).to_string_lossy().into_owned())
            } else {
                Err(PMIX_ERR_TYPE_MISMATCH)
            }
        }
    };
    let mut g = req.answers.got.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(slot) = g.1.get_mut(req.index) {
        if slot.is_none() {
            *slot = Some(answer);
            g.0 += 1;
        }
    }
    if g.0 == g.1.len() {
        req.answers.all.notify_all();
    }
}

/// Libraries opened so far, by name; leaked on purpose, they stay loaded.
static LOADED: Mutex<Vec<&'static Api>> = Mutex::new(Vec::new());

impl Api {
    /// The library named `name` (or, with `None`, the first of [`DEFAULT_LIBS`] that
    /// opens), opened once per process.
    fn load(name: Option<&str>) -> Result<&'static Self, Error> {
        let names: Vec<&str> = match name {
            Some(n) => vec![n],
            None => DEFAULT_LIBS.to_vec(),
        };
        let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(api) = loaded.iter().find(|a| names.contains(&a.name.as_str())) {
            return Ok(api);
        }
        let mut why = Vec::new();
        for n in &names {
            match Self::open(n) {
                Ok(api) => {
                    let api: &'static Self = Box::leak(Box::new(api));
                    loaded.push(api);
                    return Ok(api);
                }
                Err(e) => why.push(e),
            }
        }
        let fix = match name {
            Some(_) => format!("check {LIB_VAR}"),
            None => format!(
                "install the PMIx client library (Debian: libpmix2) or name it with \
                 {LIB_VAR}=/path/to/libpmix.so"
            ),
        };
        Err(Error::Wireup(format!(
            "this launcher offers PMIx but its client library could not be loaded ({}); \
             {fix}; or choose another exchange: RINGBTL_WIREUP=env with RINGBTL_ROOT=host:port, \
             or a PMI-1/PMI-2 launcher (srun --mpi=pmi2, mpiexec.hydra)",
            why.join("; ")
        )))
    }

    fn open(name: &str) -> Result<Self, String> {
        // SAFETY: opening a shared library runs its initializers; libpmix's only set up
        // its own globals (the client is started later, by PMIx_Init).
        let lib = unsafe { Library::open(Some(name), RTLD_NOW | RTLD_GLOBAL) }
            .map_err(|e| e.to_string())?;
        macro_rules! sym {
            ($sym:literal) => {
                // SAFETY: the symbol is the PMIx call of that name, whose C prototype
                // (pmix.h) the field's type transcribes; the pointer copied out stays
                // valid because `lib` is stored next to it and never closed.
                *unsafe { lib.get(concat!($sym, "\0").as_bytes()) }
                    .map_err(|e| format!("{name}: no {}: {e}", $sym))?
            };
        }
        Ok(Self {
            name: name.to_owned(),
            init: sym!("PMIx_Init"),
            finalize: sym!("PMIx_Finalize"),
            put: sym!("PMIx_Put"),
            commit: sym!("PMIx_Commit"),
            fence: sym!("PMIx_Fence"),
            get: sym!("PMIx_Get"),
            get_nb: sym!("PMIx_Get_nb"),
            value_destruct: sym!("PMIx_Value_destruct"),
            error_string: sym!("PMIx_Error_string"),
            _lib: lib,
        })
    }

    fn status_text(&self, rc: c_int) -> String {
        // SAFETY: PMIx_Error_string accepts any status and returns a pointer to a static,
        // NUL-terminated string (or NULL, checked), valid for the life of the process.
        let p = unsafe { (self.error_string)(rc) };
        if p.is_null() {
            return format!("PMIx status {rc}");
        }
        // SAFETY: non-null, NUL-terminated and static, as above.
        let s = unsafe { CStr::from_ptr(p) };
        format!("{} ({rc})", s.to_string_lossy())
    }

    fn check(&self, what: &str, rc: c_int) -> Result<(), Error> {
        if rc == PMIX_SUCCESS {
            Ok(())
        } else {
            Err(Error::Wireup(format!("{what}: {}", self.status_text(rc))))
        }
    }
}

/// Set while a [`PmixModex`] exists: the PMIx client is one per process.
static ACTIVE: AtomicBool = AtomicBool::new(false);

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
struct Owned(*mut Value, &'static Api);

impl Drop for Owned {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the pointer came from a successful PMIx_Get of the library `self.1`,
            // which allocates it with malloc (pmix_malloc); it is destructed by that
            // library and freed exactly once, here.
            unsafe {
                (self.1.value_destruct)(self.0);
                libc::free(self.0.cast());
            }
        }
    }
}

/// The PMIx exchange: one per process, finalized on [`Modex::finalize`] or drop.
pub struct PmixModex {
    api: &'static Api,
    me: Proc,
    size: u32,
    timeout: Duration,
    epoch: u32,
    live: bool,
    /// The job key (rank 0 draws it at the first exchange; the others read it).
    job_key: Option<JobKey>,
}

impl std::fmt::Debug for PmixModex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PmixModex")
            .field("library", &self.api.name)
            .field("nspace", &self.nspace())
            .field("rank", &self.me.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl PmixModex {
    /// Opens the PMIx client library (`library`, or the defaults: see the module docs),
    /// connects to the local PMIx server (`PMIx_Init`) and reads this process's
    /// namespace, rank and the job size. `timeout` bounds each fence.
    pub fn init(timeout: Duration, library: Option<&str>) -> Result<Self, Error> {
        let api = Api::load(library)?;
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
        let rc = unsafe { (api.init)(&mut me, ptr::null_mut(), 0) };
        if rc != PMIX_SUCCESS {
            ACTIVE.store(false, Ordering::Release);
            return Err(Error::Wireup(format!(
                "PMIx_Init (is this process running under a PMIx launcher?): {}",
                api.status_text(rc)
            )));
        }
        let mut m = Self {
            api,
            me,
            size: 0,
            timeout,
            epoch: 0,
            live: true,
            job_key: None,
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

    /// Puts a string under `key` (scope global), to be committed.
    fn put_str(&self, key: &CStr, value: &str) -> Result<(), Error> {
        let val =
            CString::new(value).map_err(|_| Error::Wireup("PMIx value with a NUL byte".into()))?;
        let mut v = Value {
            kind: PMIX_STRING,
            data: ValueData {
                string: val.as_ptr().cast_mut(),
            },
        };
        // SAFETY: `key` and the string in `v` are NUL-terminated and outlive the call;
        // PMIx_Put copies the value (it does not keep or free our pointer).
        self.api.check("PMIx_Put", unsafe {
            (self.api.put)(PMIX_GLOBAL, key.as_ptr(), &mut v)
        })
    }

    /// The string rank `rank` put under `key`.
    fn get_str(&self, rank: u32, key: &CStr) -> Result<String, Error> {
        let who = Proc { rank, ..self.me };
        let v = self.get(&who, key)?;
        // SAFETY: `v.0` is non-null and owned by `v`; the string member is read only when
        // the type tag says PMIX_STRING, and is then NUL-terminated (or NULL, checked) and
        // valid until `v` drops, after the copy.
        unsafe {
            let val = &*v.0;
            if val.kind != PMIX_STRING || val.data.string.is_null() {
                return Err(Error::Wireup(format!(
                    "PMIx value of type {} instead of a string",
                    val.kind
                )));
            }
            Ok(CStr::from_ptr(val.data.string)
                .to_string_lossy()
                .into_owned())
        }
    }

    /// The strings `asks` names (rank, key), asked all at once with `PMIx_Get_nb` and
    /// awaited together (within the exchange's timeout); one answer per ask, in order. A
    /// request the library refuses at once is asked again with the blocking `PMIx_Get`.
    fn get_strs(&self, asks: &[(u32, &CStr)]) -> Result<Vec<Result<String, Error>>, Error> {
        let answers = Arc::new(Answers {
            got: Mutex::new((0, vec![None; asks.len()])),
            all: Condvar::new(),
        });
        let reqs: Vec<Box<Request>> = (0..asks.len())
            .map(|index| {
                Box::new(Request {
                    answers: answers.clone(),
                    index,
                })
            })
            .collect();
        let mut refused = Vec::new();
        for (i, &(rank, key)) in asks.iter().enumerate() {
            let who = Proc { rank, ..self.me };
            let cbdata: *const Request = &*reqs[i];
            // SAFETY: `who` and `key` are valid for the call (the library copies them);
            // no info array; `string_answer` has the pmix_value_cbfunc_t signature, and
            // `cbdata` points to a `Request` that stays alive until its answer came (the
            // boxes are freed only after every answer, or leaked).
            let rc = unsafe {
                (self.api.get_nb)(
                    &who,
                    key.as_ptr(),
                    ptr::null(),
                    0,
                    string_answer,
                    cbdata.cast_mut().cast(),
                )
            };
            if rc != PMIX_SUCCESS {
                refused.push(i);
            }
        }
        // Requests refused at once get no callback: they count as answered here.
        {
            let mut g = answers.got.lock().unwrap_or_else(|e| e.into_inner());
            for &i in &refused {
                if g.1[i].is_none() {
                    g.1[i] = Some(Err(PMIX_ERR_NOT_FOUND));
                    g.0 += 1;
                }
            }
        }
        let deadline = Instant::now() + self.timeout;
        let mut g = answers.got.lock().unwrap_or_else(|e| e.into_inner());
        while g.0 < g.1.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(g);
                // Answers may still come: their requests must stay valid.
                std::mem::forget(reqs);
                return Err(Error::Wireup(format!(
                    "PMIx_Get_nb: no answer within {:?}",
                    self.timeout
                )));
            }
            g = answers
                .all
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let got = std::mem::take(&mut g.1);
        drop(g);
        drop(reqs);
        Ok(got
            .into_iter()
            .enumerate()
            .map(|(i, a)| match a {
                Some(Ok(s)) => Ok(s),
                _ if refused.contains(&i) => self.get_str(asks[i].0, asks[i].1),
                Some(Err(rc)) => Err(Error::Wireup(format!(
                    "PMIx_Get_nb({}): {}",
                    asks[i].1.to_string_lossy(),
                    self.api.status_text(rc)
                ))),
                None => unreachable!("every request was answered"),
            })
            .collect())
    }

    fn get(&self, who: &Proc, key: &CStr) -> Result<Owned, Error> {
        let mut out: *mut Value = ptr::null_mut();
        // SAFETY: `who` and `key` are valid for the call (a pmix_proc_t and a
        // NUL-terminated string); no info array; `out` is a valid out-pointer that the
        // library sets to a malloc'd value on success, then owned by `Owned`.
        let rc = unsafe { (self.api.get)(who, key.as_ptr(), ptr::null(), 0, &mut out) };
        let owned = Owned(out, self.api);
        self.api
            .check(&format!("PMIx_Get({})", key.to_string_lossy()), rc)?;
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
        self.put_str(&key, my_uris)?;
        // The job key: drawn by rank 0 and published with its addresses, before the one
        // fence; only the job's processes can read the launcher's store.
        let first = self.job_key.is_none();
        if first && self.me.rank == 0 {
            let k = JobKey::generate()?;
            self.put_str(JOB_KEY, &k.to_hex())?;
            self.job_key = Some(k);
        }
        // SAFETY: no arguments; the client is initialized (`live`).
        let rc = unsafe { (self.api.commit)() };
        self.api.check("PMIx_Commit", rc)?;
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
        let rc = unsafe { (self.api.fence)(&all, 1, infos.as_ptr(), infos.len()) };
        self.api.check(
            &format!(
                "PMIx_Fence over {} ranks (a rank missing or late past {}s; PMIx does not \
                 say which)",
                self.size, secs
            ),
            rc,
        )?;
        // Every rank's addresses, and the job key after them when not known yet, asked
        // at once.
        let mut asks: Vec<(u32, &CStr)> = (0..self.size).map(|r| (r, key.as_c_str())).collect();
        if self.job_key.is_none() {
            asks.push((0, JOB_KEY));
        }
        let mut got = self.get_strs(&asks)?.into_iter();
        let table = (0..self.size)
            .zip(got.by_ref())
            .map(|(r, v)| v.map_err(|e| Error::Wireup(format!("addresses of rank {r}: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(hex) = got.next() {
            let hex = hex.map_err(|e| Error::Wireup(format!("job key of rank 0: {e}")))?;
            let k = JobKey::from_hex(&hex)
                .map_err(|e| Error::Wireup(format!("job key of rank 0 from PMIx: {e}")))?;
            self.job_key = Some(k);
        }
        Ok(table)
    }

    fn job_key(&self) -> Option<JobKey> {
        self.job_key.clone()
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
        let rc = unsafe { (self.api.finalize)(ptr::null(), 0) };
        ACTIVE.store(false, Ordering::Release);
        self.api.check("PMIx_Finalize", rc)
    }
}

impl Drop for PmixModex {
    fn drop(&mut self) {
        if let Err(e) = self.finalize() {
            tracing::warn!("{e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// The layouts and constants above, as the installed `pmix_common.h` has them: a small
    /// C program compiled against the headers prints them (Debian: `libpmix-dev`).
    #[test]
    fn layouts_match_the_installed_headers() {
        let cflags = match Command::new("pkg-config")
            .args(["--cflags", "pmix"])
            .output()
        {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
            other => {
                return crate::skip::skip(format_args!(
                    "no PMIx headers (`pkg-config --cflags pmix`: {other:?}; Debian: libpmix-dev)"
                ))
            }
        };
        let dir = std::env::temp_dir().join(format!("ringbtl-pmix-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("layout.c");
        std::fs::write(
            &src,
            r#"#include <stddef.h>
#include <stdio.h>
#include <pmix.h>
int main(void) {
    printf("%zu %zu %zu %zu %zu %d %d %d %d %d %d %d %d %u %s %s %s %d %d\n",
        sizeof(pmix_proc_t), sizeof(pmix_value_t), _Alignof(pmix_value_t),
        sizeof(pmix_info_t), offsetof(pmix_info_t, value),
        PMIX_MAX_NSLEN + 1, PMIX_MAX_KEYLEN + 1, PMIX_SUCCESS, PMIX_BOOL, PMIX_STRING,
        PMIX_INT, PMIX_UINT32, PMIX_GLOBAL, (unsigned)PMIX_RANK_WILDCARD, PMIX_JOB_SIZE,
        PMIX_COLLECT_DATA, PMIX_TIMEOUT, PMIX_ERR_NOT_FOUND, PMIX_ERR_TYPE_MISMATCH);
    return 0;
}
"#,
        )
        .unwrap();
        let exe = dir.join("layout");
        let cc = Command::new("cc")
            .args(cflags.split_whitespace())
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .output();
        let cc = match cc {
            Ok(o) => o,
            Err(e) => return crate::skip::skip(format_args!("no C compiler (`cc`): {e}")),
        };
        assert!(
            cc.status.success(),
            "compiling against the PMIx headers failed: {}",
            String::from_utf8_lossy(&cc.stderr)
        );
        let out = Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let got = String::from_utf8(out.stdout).unwrap();
        let want = format!(
            "{} {} {} {} {} {NSPACE_LEN} {KEY_LEN} {PMIX_SUCCESS} {PMIX_BOOL} {PMIX_STRING} \
             {PMIX_INT} {PMIX_UINT32} {PMIX_GLOBAL} {PMIX_RANK_WILDCARD} {} {} {} \
             {PMIX_ERR_NOT_FOUND} {PMIX_ERR_TYPE_MISMATCH}",
            size_of::<Proc>(),
            size_of::<Value>(),
            align_of::<Value>(),
            size_of::<Info>(),
            std::mem::offset_of!(Info, value),
            PMIX_JOB_SIZE.to_str().unwrap(),
            PMIX_COLLECT_DATA.to_str().unwrap(),
            PMIX_TIMEOUT.to_str().unwrap(),
        );
        assert_eq!(got.trim(), want);
    }

    /// The default library opens and has every call used; loading it again reuses it.
    #[test]
    fn the_installed_library_has_every_call() {
        let api = match Api::load(None) {
            Ok(api) => api,
            Err(e) => return crate::skip::skip(e),
        };
        assert!(DEFAULT_LIBS.contains(&api.name.as_str()), "{}", api.name);
        assert!(ptr::eq(api, Api::load(Some(&api.name)).unwrap()));
        // A status the library knows has a name.
        assert!(
            api.status_text(PMIX_SUCCESS).contains("SUCCESS"),
            "{}",
            api.status_text(0)
        );
    }

    /// A library that lacks the PMIx calls is refused with the name of the missing one.
    #[test]
    fn a_library_without_pmix_is_refused() {
        let e = Api::load(Some("libc.so.6"))
            .err()
            .expect("libc is not PMIx");
        let e = e.to_string();
        assert!(e.contains("libc.so.6: no PMIx_Init"), "{e}");
    }
}
