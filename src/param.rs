//! Parameter tables: the one description of a setting, below every layer.
//!
//! Each layer declares its settings as a table of [`Param`] rows next to its settings
//! struct (the protocol core in `proto/config.rs`, the sockets in `reactor/config.rs`,
//! wire-up in `wireup/config.rs`, the transport's own in `config.rs`). A row names the
//! field and its `RINGBTL_*` variable, states the type and range, and says what the
//! setting does; the same row then drives
//!
//! - parsing a value from text (the environment, [`Config::set`](crate::Config::set));
//! - checking a value, whether it was set in code or parsed from text: both go through
//!   [`Param::check`];
//! - the configuration table of the README and `ringbtl-bench --print-config`.
//!
//! This module knows no layer and imports nothing from the crate: errors are plain
//! messages that the caller wraps.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

/// Where a parameter's value came from (as `ompi_info --param` and `ucx_info -c` show).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The built-in default.
    Default,
    /// The process environment (a `RINGBTL_*` variable, or what the launcher exported).
    Env,
    /// Set by the program (a field assignment, or [`Config::set`](crate::Config::set)).
    Code,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::Default => "default",
            Origin::Env => "environment",
            Origin::Code => "code",
        })
    }
}

/// How an integer is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A plain count.
    Count,
    /// Bytes: shown with a `k`/`m`/`g` suffix when that is exact.
    Bytes,
    /// Milliseconds (the field holds a `Duration`).
    Millis,
    /// Shown in hexadecimal (`0x...`).
    Hex,
}

/// The type and accepted range of a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An integer in `lo..=hi`: decimal, `0x` hexadecimal, or with a binary `k`/`m`/`g`
    /// suffix.
    Int {
        /// Smallest accepted value.
        lo: u64,
        /// Largest accepted value.
        hi: u64,
        /// How the value is shown.
        unit: Unit,
    },
    /// `0` for off (the field is `None`), or an integer in `lo..=hi`.
    IntOrOff {
        /// Smallest accepted value other than 0.
        lo: u64,
        /// Largest accepted value.
        hi: u64,
        /// How the value is shown.
        unit: Unit,
        /// What `0` means.
        off: &'static str,
    },
    /// A power of two in `lo..=hi`.
    Pow2 {
        /// Smallest accepted value.
        lo: u64,
        /// Largest accepted value.
        hi: u64,
    },
    /// `0` or `1`.
    Bool,
    /// Anything else: the syntax, in words.
    Text(&'static str),
    /// A secret, in this syntax: its value is shown as `<set>` and never echoed in an
    /// error.
    Secret(&'static str),
}

impl fmt::Display for Kind {
    /// The type and range as documented (`bytes, 4k..=64m`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = |u: Unit| match u {
            Unit::Count | Unit::Hex => "integer",
            Unit::Bytes => "bytes",
            Unit::Millis => "ms",
        };
        match *self {
            Kind::Int { lo, hi, unit: u } => {
                write!(f, "{}, {}..={}", unit(u), show(lo, u), show(hi, u))
            }
            Kind::IntOrOff {
                lo,
                hi,
                unit: u,
                off,
            } => write!(
                f,
                "{}, {}..={}; 0 = {off}",
                unit(u),
                show(lo, u),
                show(hi, u)
            ),
            Kind::Pow2 { lo, hi } => write!(f, "power of two, {lo}..={hi}"),
            Kind::Bool => f.write_str("0 or 1"),
            Kind::Text(t) | Kind::Secret(t) => f.write_str(t),
        }
    }
}

/// How a row reads and writes its field.
pub enum Access<C: 'static> {
    /// A number (integer, size, duration in ms, flag): `None` is off (`0`, only for
    /// [`Kind::IntOrOff`]). Parsing, checking and showing follow the row's [`Kind`].
    Num {
        /// The field's value (a `Duration` in whole milliseconds, a flag as 0 or 1).
        get: fn(&C) -> Option<u64>,
        /// Stores a value that passed the row's range.
        put: fn(&mut C, Option<u64>),
    },
    /// Any other type, with its own text form.
    Text {
        /// The field's value in the syntax `parse` accepts.
        get: fn(&C) -> String,
        /// Parses text and stores it; the error says what was expected.
        parse: fn(&mut C, &str) -> Result<(), String>,
        /// Checks the stored value; the error says what is accepted.
        check: fn(&C) -> Result<(), String>,
    },
}

/// One row of a layer's table.
pub struct Param<C: 'static> {
    /// The field of the layer's settings struct.
    pub name: &'static str,
    /// The environment variable (`RINGBTL_*`).
    pub var: &'static str,
    /// Type and accepted range.
    pub kind: Kind,
    /// What the setting does.
    pub meaning: &'static str,
    /// Who sets it, and why: the site whose choice it is (a setting exists only where a
    /// site really chooses; what the code can measure, it decides).
    pub site: &'static str,
    /// How the field is read and written.
    pub access: Access<C>,
}

impl<C: Clone> Param<C> {
    /// The value in `c`, as text the variable accepts.
    pub fn get(&self, c: &C) -> String {
        match &self.access {
            Access::Num { get, .. } => match (get(c), self.kind) {
                (None, _) => "0".into(),
                (Some(n), Kind::Int { unit, .. } | Kind::IntOrOff { unit, .. }) => show(n, unit),
                (Some(n), _) => n.to_string(),
            },
            Access::Text { get, .. } => get(c),
        }
    }

    /// Parses `text` and stores it in `c`, after checking it; on error `c` is unchanged
    /// and the message names the variable, the text and what is accepted.
    pub fn set(&self, c: &mut C, text: &str) -> Result<(), String> {
        let named = |why: String| match self.kind {
            Kind::Secret(_) => format!("{}=<secret>: {why}", self.var),
            _ => format!("{}={text:?}: {why}", self.var),
        };
        match &self.access {
            Access::Num { put, .. } => {
                let v = self.parse_num(text).map_err(named)?;
                put(c, v);
                Ok(())
            }
            Access::Text { parse, check, .. } => {
                let mut new = c.clone();
                parse(&mut new, text).map_err(named)?;
                check(&new).map_err(named)?;
                *c = new;
                Ok(())
            }
        }
    }

    /// Checks the value in `c` (however it was set); the message names the setting, its
    /// variable and the accepted range.
    pub fn check(&self, c: &C) -> Result<(), String> {
        let why = match &self.access {
            Access::Num { get, .. } => self.check_num(get(c)),
            Access::Text { check, .. } => check(c),
        };
        why.map_err(|why| format!("{} = {} ({}): {why}", self.name, self.get(c), self.var))
    }

    fn parse_num(&self, text: &str) -> Result<Option<u64>, String> {
        let v = parse_int(text).ok_or_else(|| format!("expected {}", self.kind))?;
        let v = match self.kind {
            Kind::IntOrOff { .. } if v == 0 => None,
            _ => Some(v),
        };
        self.check_num(v)?;
        Ok(v)
    }

    fn check_num(&self, v: Option<u64>) -> Result<(), String> {
        let ok = match (self.kind, v) {
            (Kind::IntOrOff { .. }, None) => true,
            (Kind::Int { lo, hi, .. } | Kind::IntOrOff { lo, hi, .. }, Some(n)) => {
                (lo..=hi).contains(&n)
            }
            (Kind::Pow2 { lo, hi }, Some(n)) => (lo..=hi).contains(&n) && n.is_power_of_two(),
            (Kind::Bool, Some(n)) => n <= 1,
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(format!("expected {}", self.kind))
        }
    }
}

/// A layer's settings struct with its table.
pub trait Params: Clone + 'static {
    /// The layer's name, as shown before each setting (`core`, `socket`, ...).
    const LAYER: &'static str;

    /// The layer's rows.
    fn params() -> &'static [Param<Self>];

    /// Checks every row of the table (the same checks as for parsed values).
    fn check_params(&self) -> Result<(), String> {
        Self::params().iter().try_for_each(|p| p.check(self))
    }

    /// The row of variable `var`.
    fn param(var: &str) -> Option<&'static Param<Self>> {
        Self::params().iter().find(|p| p.var == var)
    }

    /// Applies every variable `get` returns a non-blank value for; `applied` hears of
    /// each variable applied. The first bad value is the error.
    fn apply_vars(
        &mut self,
        get: &dyn Fn(&str) -> Option<String>,
        applied: &mut dyn FnMut(&'static str),
    ) -> Result<(), String> {
        for p in Self::params() {
            let v = get(p.var).or_else(|| renamed_value(p.var, get));
            if let Some(v) = v.filter(|v| !v.trim().is_empty()) {
                p.set(self, &v)?;
                applied(p.var);
            }
        }
        Ok(())
    }
}

/// Variables that were renamed, as (new name, old name): the old name is still read,
/// with a warning, when the new one is unset.
pub(crate) const RENAMED: [(&str, &str); 1] =
    [("RINGBTL_WIREUP_TIMEOUT_MS", "RINGBTL_WIREUP_TIMEOUT")];

/// Variables no longer read, with what decides their behaviour now. Each was a knob whose
/// best value the code can tell from what it sees (the peer on loopback or not, the
/// congestion control pacing or not), or one that only tests varied.
pub(crate) const RETIRED: [(&str, &str); 17] = [
    (
        "RINGBTL_INLINE",
        "payloads up to 1 KiB are copied next to their header",
    ),
    (
        "RINGBTL_COALESCE_BYTES",
        "a gathered send holds up to 256 KiB",
    ),
    ("RINGBTL_MAX_IOV", "a gathered send holds up to 256 iovecs"),
    (
        "RINGBTL_SEND_CHUNK",
        "send calls follow the congestion control",
    ),
    (
        "RINGBTL_PACED_SEND_CHUNK",
        "send calls follow the congestion control",
    ),
    (
        "RINGBTL_PACED_COPY_CHUNK",
        "send calls follow the congestion control",
    ),
    (
        "RINGBTL_PACED_QUICK_ACK",
        "ACKs follow the congestion control",
    ),
    (
        "RINGBTL_PACED_RCVLOWAT",
        "the receive low-water mark follows the congestion control",
    ),
    (
        "RINGBTL_SPLICE",
        "payloads from 128 KiB are lent to the kernel",
    ),
    (
        "RINGBTL_SPLICE_MAX",
        "a stream's payloads above 1 MiB are copied",
    ),
    (
        "RINGBTL_SPLICE_IDLE",
        "idle payloads are copied where the congestion control paces",
    ),
    (
        "RINGBTL_ZEROCOPY_LOOPBACK",
        "zero-copy sends never go to loopback peers",
    ),
    (
        "RINGBTL_RECV_RING_BUFS",
        "the multishot ring has 256 buffers",
    ),
    (
        "RINGBTL_RECV_RING_BUF_SIZE",
        "the multishot ring's buffers are 16 KiB",
    ),
    ("RINGBTL_NODELAY", "TCP_NODELAY is always on"),
    (
        "RINGBTL_RETRY_DELAY_MS",
        "connect retries start after 20 ms and double",
    ),
    (
        "RINGBTL_MAX_HALF_OPEN_PER_SOURCE",
        "one source may hold a quarter of RINGBTL_MAX_HALF_OPEN",
    ),
];

/// The value of the old name of the renamed variable `var`, when that is set; says
/// once per process, on stderr, that the old name is read.
fn renamed_value(var: &str, get: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let (_, old) = RENAMED.iter().find(|(new, _)| *new == var)?;
    let v = get(old).filter(|v| !v.trim().is_empty())?;
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!("ringbtl: {old} is read as {var}, its new name; set {var} instead");
    }
    Some(v)
}

/// The name a variable goes by now: `var` itself, or the new name of a renamed one.
pub(crate) fn current_name(var: &str) -> &str {
    RENAMED
        .iter()
        .find(|(_, old)| *old == var)
        .map_or(var, |(new, _)| new)
}

/// One line for each retired variable `get` sets (see [`RETIRED`]).
pub(crate) fn retired_notes(get: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    RETIRED
        .iter()
        .filter(|(var, _)| get(var).is_some_and(|v| !v.trim().is_empty()))
        .map(|(var, now)| format!("ringbtl: {var} is no longer read ({now}); ignored"))
        .collect()
}

/// Parses an integer: decimal, `0x` hexadecimal, or with a binary `k`/`m`/`g` suffix.
pub fn parse_int(text: &str) -> Option<u64> {
    let t = text.trim().to_ascii_lowercase();
    let (digits, mult) = match t.as_bytes().last() {
        Some(b'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some(b'm') => (&t[..t.len() - 1], 1 << 20),
        Some(b'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (&t[..], 1),
    };
    if let Some(h) = digits.strip_prefix("0x") {
        u64::from_str_radix(h, 16).ok()
    } else {
        digits.parse::<u64>().ok()
    }
    .and_then(|n| n.checked_mul(mult))
}

/// Parses an integer as [`parse_int`] does, in `lo..=hi`; the error names `name`.
pub fn parse_u64(name: &str, v: &str, lo: u64, hi: u64) -> Result<u64, String> {
    match parse_int(v) {
        Some(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(format!("{name}={v:?}: expected an integer in {lo}..={hi}")),
    }
}

/// `n` as text in `unit` (sizes with an exact binary suffix: `64k`, `1m`).
pub fn show(n: u64, unit: Unit) -> String {
    match unit {
        Unit::Bytes if n > 0 => {
            for (shift, s) in [(30, 'g'), (20, 'm'), (10, 'k')] {
                if n.is_multiple_of(1 << shift) {
                    return format!("{}{s}", n >> shift);
                }
            }
            n.to_string()
        }
        Unit::Hex if n > 0 => format!("{n:#x}"),
        _ => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    struct S {
        n: usize,
        off: Option<usize>,
        flag: bool,
        word: String,
    }

    impl Params for S {
        const LAYER: &'static str = "test";
        fn params() -> &'static [Param<Self>] {
            &[
                Param {
                    name: "n",
                    var: "T_N",
                    kind: Kind::Int {
                        lo: 4096,
                        hi: 1 << 20,
                        unit: Unit::Bytes,
                    },
                    meaning: "a size",
                    site: "tests",
                    access: Access::Num {
                        get: |s| Some(s.n as u64),
                        put: |s, v| s.n = v.unwrap_or(0) as usize,
                    },
                },
                Param {
                    name: "off",
                    var: "T_OFF",
                    kind: Kind::IntOrOff {
                        lo: 8,
                        hi: 64,
                        unit: Unit::Count,
                        off: "off",
                    },
                    meaning: "optional",
                    site: "tests",
                    access: Access::Num {
                        get: |s| s.off.map(|n| n as u64),
                        put: |s, v| s.off = v.map(|n| n as usize),
                    },
                },
                Param {
                    name: "flag",
                    var: "T_FLAG",
                    kind: Kind::Bool,
                    meaning: "a flag",
                    site: "tests",
                    access: Access::Num {
                        get: |s| Some(s.flag.into()),
                        put: |s, v| s.flag = v == Some(1),
                    },
                },
                Param {
                    name: "word",
                    var: "T_WORD",
                    kind: Kind::Text("lowercase letters"),
                    meaning: "a word",
                    site: "tests",
                    access: Access::Text {
                        get: |s| s.word.clone(),
                        parse: |s, v| {
                            s.word = v.trim().to_owned();
                            Ok(())
                        },
                        check: |s| {
                            if s.word.bytes().all(|b| b.is_ascii_lowercase()) {
                                Ok(())
                            } else {
                                Err("expected lowercase letters".into())
                            }
                        },
                    },
                },
            ]
        }
    }

    fn s() -> S {
        S {
            n: 8192,
            off: None,
            flag: true,
            word: "abc".into(),
        }
    }

    #[test]
    fn text_round_trips_and_shows_units() {
        let mut c = s();
        assert_eq!(S::param("T_N").unwrap().get(&c), "8k");
        assert_eq!(S::param("T_OFF").unwrap().get(&c), "0");
        for p in S::params() {
            let before = c.clone();
            p.set(&mut c, &p.get(&before)).unwrap();
            assert_eq!(c, before, "{}", p.var);
        }
        S::param("T_N").unwrap().set(&mut c, "0x3000").unwrap();
        assert_eq!(c.n, 0x3000);
        assert_eq!(S::param("T_N").unwrap().get(&c), "12k");
        S::param("T_OFF").unwrap().set(&mut c, "16").unwrap();
        assert_eq!(c.off, Some(16));
        assert_eq!(show(5000, Unit::Bytes), "5000");
        assert_eq!(show(3 << 30, Unit::Bytes), "3g");
        assert_eq!(show(255, Unit::Hex), "0xff");
    }

    #[test]
    fn parsed_and_stored_values_meet_the_same_check() {
        let mut c = s();
        for (var, text) in [
            ("T_N", "4095"),
            ("T_N", "2m"),
            ("T_N", "big"),
            ("T_OFF", "4"),
            ("T_FLAG", "2"),
            ("T_WORD", "ABC"),
        ] {
            let e = S::param(var).unwrap().set(&mut c, text).unwrap_err();
            assert!(e.starts_with(&format!("{var}={text:?}: expected")), "{e}");
            assert_eq!(c, s(), "a refused value leaves the struct as it was");
        }
        c.n = 100;
        c.off = Some(0);
        c.word = "X".into();
        let e = c.check_params().unwrap_err();
        assert_eq!(e, "n = 100 (T_N): expected bytes, 4k..=1m");
        c.n = 4096;
        let e = c.check_params().unwrap_err();
        assert_eq!(e, "off = 0 (T_OFF): expected integer, 8..=64; 0 = off");
        c.off = Some(64);
        let e = c.check_params().unwrap_err();
        assert!(e.starts_with("word = X (T_WORD)"), "{e}");
        c.word.clear();
        c.check_params().unwrap();
    }

    #[test]
    fn apply_vars_reports_what_it_applied() {
        let mut c = s();
        let mut seen = Vec::new();
        let get = |k: &str| match k {
            "T_N" => Some("16k".to_string()),
            "T_WORD" => Some("  ".to_string()),
            _ => None,
        };
        c.apply_vars(&get, &mut |v| seen.push(v)).unwrap();
        assert_eq!(seen, ["T_N"]);
        assert_eq!(c.n, 16 << 10);
        assert_eq!(c.word, "abc", "a blank value leaves the default");
        assert_eq!(parse_int(" 2K "), Some(2048));
        assert_eq!(parse_int("0x10k"), Some(16 << 10));
        assert_eq!(parse_int("99999999999g"), None);
        assert!(parse_u64("X", "3", 4, 5).unwrap_err().contains("X=\"3\""));
    }
}
