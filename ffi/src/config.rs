//! `ringbtl_config_t`: a [`Config`] built before the transport, set by the names of the
//! environment variables and checked by the library's own parser.

use std::ffi::{c_char, c_int, CStr};

use ringbtl::{Config, PeerId};

use crate::status::{
    fail, fail_with, guard, RINGBTL_ERR_CONFIG, RINGBTL_ERR_INTERNAL, RINGBTL_ERR_INVALID,
    RINGBTL_OK,
};

/// The settings of a transport not created yet (`ringbtl_config_t`).
#[derive(Debug)]
pub struct RingbtlConfig {
    pub(crate) cfg: Config,
}

/// Creates a configuration with the defaults for process `local_id` (its rank) in `*out`.
///
/// # Safety
/// `out` is NULL or points to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_config_new(local_id: u32, out: *mut *mut RingbtlConfig) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        if out.is_null() {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_config_new: out is NULL");
        }
        let b = Box::new(RingbtlConfig {
            cfg: Config::new(PeerId(local_id)),
        });
        // SAFETY: `out` is non-null and writable (the caller's contract).
        unsafe { out.write(Box::into_raw(b)) };
        RINGBTL_OK
    })
}

/// Sets one parameter by its environment-variable name, with the environment's parsing
/// and range checks. On error the configuration is unchanged.
///
/// # Safety
/// `cfg` is NULL or from `ringbtl_config_new` and not freed; `name` and `value` are NULL
/// or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_config_set(
    cfg: *mut RingbtlConfig,
    name: *const c_char,
    value: *const c_char,
) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: `cfg` is NULL or a live configuration owned by the caller, who makes no
        // other use of it during the call.
        let Some(c) = (unsafe { cfg.as_mut() }) else {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_config_set: cfg is NULL");
        };
        if name.is_null() || value.is_null() {
            return fail(
                RINGBTL_ERR_INVALID,
                "ringbtl_config_set: name or value is NULL",
            );
        }
        // SAFETY: both are non-null NUL-terminated strings (the caller's contract).
        let (name, value) = unsafe { (CStr::from_ptr(name), CStr::from_ptr(value)) };
        let (Ok(name), Ok(value)) = (name.to_str(), value.to_str()) else {
            return fail(RINGBTL_ERR_CONFIG, "ringbtl_config_set: not UTF-8 text");
        };
        match set(&c.cfg, name, value) {
            Ok(new) => {
                c.cfg = new;
                RINGBTL_OK
            }
            Err(code) => code,
        }
    })
}

/// Applies the `RINGBTL_*` variables of the process environment. On error the
/// configuration is unchanged.
///
/// # Safety
/// `cfg` is NULL or from `ringbtl_config_new` and not freed.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_config_from_env(cfg: *mut RingbtlConfig) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: `cfg` is NULL or a live configuration owned by the caller.
        let Some(c) = (unsafe { cfg.as_mut() }) else {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_config_from_env: cfg is NULL");
        };
        match c.cfg.clone().from_env() {
            Ok(new) => {
                c.cfg = new;
                RINGBTL_OK
            }
            Err(e) => fail_with(&e),
        }
    })
}

/// Says whether the transport will be entered from more than one thread, one call at a
/// time (the caller holds a lock around every call): nonzero builds the io_uring ring
/// for any thread (`SocketConfig::threads`). Off by default.
///
/// # Safety
/// `cfg` is NULL or from `ringbtl_config_new` and not freed.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_config_threads(cfg: *mut RingbtlConfig, on: c_int) -> c_int {
    guard(RINGBTL_ERR_INTERNAL, || {
        // SAFETY: `cfg` is NULL or a live configuration owned by the caller.
        let Some(c) = (unsafe { cfg.as_mut() }) else {
            return fail(RINGBTL_ERR_INVALID, "ringbtl_config_threads: cfg is NULL");
        };
        c.cfg.socket.threads = on != 0;
        RINGBTL_OK
    })
}

/// Frees a configuration that was not given to `ringbtl_create`. NULL is fine.
///
/// # Safety
/// `cfg` is NULL or from `ringbtl_config_new`, not freed or consumed before.
#[no_mangle]
pub unsafe extern "C" fn ringbtl_config_free(cfg: *mut RingbtlConfig) {
    guard((), || {
        if !cfg.is_null() {
            // SAFETY: `cfg` came from `Box::into_raw` in `ringbtl_config_new` and is
            // freed once (the caller's contract).
            drop(unsafe { Box::from_raw(cfg) });
        }
    })
}

/// `cfg` with `name` set to `value`, parsed and checked as in the environment
/// ([`Config::set`]).
fn set(cfg: &Config, name: &str, value: &str) -> Result<Config, c_int> {
    if !setting_names().contains(&name) {
        return Err(fail(
            RINGBTL_ERR_CONFIG,
            format!(
                "unknown setting {name:?}; the settings are: {}",
                setting_names().join(", ")
            ),
        ));
    }
    let mut new = cfg.clone();
    new.set(name, value).map_err(|e| fail_with(&e))?;
    Ok(new)
}

/// Every `RINGBTL_*` variable of the library's parameter tables, in their order.
fn setting_names() -> Vec<&'static str> {
    Config::new(PeerId(0))
        .settings()
        .into_iter()
        .map(|s| s.var)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_parameter_tables() {
        let names = setting_names();
        for n in ["RINGBTL_MAX_FRAME", "RINGBTL_BACKEND", "RINGBTL_IF_INCLUDE"] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
        assert!(names.iter().all(|n| n.starts_with("RINGBTL_")));
    }

    #[test]
    fn set_parses_like_the_environment() {
        let c = Config::new(PeerId(3));
        let c = set(&c, "RINGBTL_MAX_FRAME", "2m").unwrap();
        let backend = if cfg!(feature = "epoll") {
            "epoll"
        } else {
            "uring"
        };
        let c = set(&c, "RINGBTL_BACKEND", backend).unwrap();
        assert_eq!(
            set(&c, "RINGBTL_MAX_FRAME", "12").unwrap_err(),
            RINGBTL_ERR_CONFIG
        );
        assert_eq!(
            set(&c, "RINGBTL_NOPE", "1").unwrap_err(),
            RINGBTL_ERR_CONFIG
        );
        // Both settings are in force (the failed ones changed nothing): seen through the
        // transport they configure.
        let t = match ringbtl::Transport::new(c) {
            Ok(t) => t,
            Err(e @ ringbtl::Error::NoBackend(_)) => {
                crate::skip::skip(format_args!("backend {backend} unavailable here: {e}"));
                return;
            }
            Err(e) => panic!("{e}"),
        };
        assert_eq!(t.backend_name(), backend);
        assert_eq!(t.local_id(), PeerId(3));
        assert_eq!(crate::handle::max_frame(&t), 2 << 20);
    }
}
