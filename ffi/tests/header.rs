//! The hand-written header and the library agree: every function the header declares is
//! exported by the static library and no exported `ringbtl_*` function is missing from
//! the header; the status codes and the ABI version have the same values on both sides.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use ringbtl_ffi::*;

/// The header without its comments.
fn header_code() -> String {
    let text = std::fs::read_to_string(support::header()).expect("read ringbtl.h");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find("*/").expect("unterminated comment") + i + 2;
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Names of the functions the header declares: `ringbtl_x(` not preceded by `(*`, which
/// would be a function-pointer type.
fn declared_functions(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = code.as_bytes();
    let mut at = 0;
    while let Some(i) = code[at..].find("ringbtl_").map(|i| i + at) {
        let end = i + code[i..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(code.len() - i);
        let after = code[end..].trim_start();
        let before = code[..i].trim_end();
        let word_start = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let fn_pointer = before
            .strip_suffix('*')
            .is_some_and(|b| b.trim_end().ends_with('('));
        if word_start && after.starts_with('(') && !fn_pointer {
            out.insert(code[i..end].to_string());
        }
        at = end;
    }
    out
}

/// `ringbtl_*` functions the static library defines: its global, defined `FUNC` symbols
/// as `readelf -sW` lists them (binutils' `nm` lists none in a release build, whose
/// objects carry LLVM bitcode beside their code).
fn exported_functions() -> BTreeSet<String> {
    let out = Command::new("readelf")
        .arg("-sW")
        .arg(support::staticlib())
        .output()
        .expect("run readelf (binutils)");
    assert!(out.status.success(), "readelf failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            // Num: Value Size Type Bind Vis Ndx Name
            let f: Vec<&str> = l.split_whitespace().collect();
            let &[_, _, _, kind, bind, _, ndx, name] = f.as_slice() else {
                return None;
            };
            (kind == "FUNC" && bind == "GLOBAL" && ndx != "UND" && name.starts_with("ringbtl_"))
                .then(|| name.to_string())
        })
        .collect()
}

#[test]
fn every_declared_function_is_exported_and_every_export_declared() {
    let declared = declared_functions(&header_code());
    assert!(
        declared.len() >= 20 && declared.contains("ringbtl_send"),
        "parsed {declared:?}"
    );
    let exported = exported_functions();
    let missing: Vec<_> = declared.difference(&exported).collect();
    let undeclared: Vec<_> = exported.difference(&declared).collect();
    assert!(missing.is_empty(), "declared, not exported: {missing:?}");
    assert!(
        undeclared.is_empty(),
        "exported, not declared: {undeclared:?}"
    );
    println!("{} functions declared and exported", declared.len());
}

#[test]
fn codes_and_version_match_the_header() {
    let code = header_code();
    let mut values = BTreeMap::new();
    for line in code.lines() {
        let t = line.trim().trim_end_matches(',');
        if let Some((name, value)) = t.split_once('=') {
            let name = name.trim();
            if name.starts_with("RINGBTL_") {
                values.insert(name.to_string(), value.trim().parse::<i32>().expect(t));
            }
        }
    }
    let ours = [
        ("RINGBTL_OK", RINGBTL_OK),
        ("RINGBTL_ERR_INVALID", RINGBTL_ERR_INVALID),
        ("RINGBTL_ERR_CONFIG", RINGBTL_ERR_CONFIG),
        ("RINGBTL_ERR_IO", RINGBTL_ERR_IO),
        ("RINGBTL_ERR_UNREACHABLE", RINGBTL_ERR_UNREACHABLE),
        ("RINGBTL_ERR_UNKNOWN_PEER", RINGBTL_ERR_UNKNOWN_PEER),
        ("RINGBTL_ERR_TOO_LARGE", RINGBTL_ERR_TOO_LARGE),
        (
            "RINGBTL_ERR_TOO_MANY_SEGMENTS",
            RINGBTL_ERR_TOO_MANY_SEGMENTS,
        ),
        ("RINGBTL_ERR_SHUTDOWN", RINGBTL_ERR_SHUTDOWN),
        ("RINGBTL_ERR_TAG_IN_USE", RINGBTL_ERR_TAG_IN_USE),
        ("RINGBTL_ERR_WOULD_BLOCK", RINGBTL_ERR_WOULD_BLOCK),
        ("RINGBTL_ERR_TIMEOUT", RINGBTL_ERR_TIMEOUT),
        ("RINGBTL_ERR_NO_BACKEND", RINGBTL_ERR_NO_BACKEND),
        ("RINGBTL_ERR_PEER_CLOSED", RINGBTL_ERR_PEER_CLOSED),
        ("RINGBTL_ERR_PROTOCOL", RINGBTL_ERR_PROTOCOL),
        ("RINGBTL_ERR_BUSY", RINGBTL_ERR_BUSY),
        ("RINGBTL_ERR_INTERNAL", RINGBTL_ERR_INTERNAL),
    ];
    let ours: BTreeMap<String, i32> = ours.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    assert_eq!(
        values, ours,
        "status codes differ between header and library"
    );
    let version = code
        .lines()
        .find_map(|l| l.trim().strip_prefix("#define RINGBTL_ABI_VERSION"))
        .expect("RINGBTL_ABI_VERSION in the header");
    assert_eq!(
        version.trim().trim_end_matches('u').parse::<u32>().unwrap(),
        RINGBTL_ABI_VERSION
    );
    assert_eq!(ringbtl_abi_version(), RINGBTL_ABI_VERSION);
}
