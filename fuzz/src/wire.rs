//! `Header::parse`, `Hello::parse` and `RunFrame::parse` on arbitrary bytes.
//!
//! Properties: parsing never panics; a short buffer is `Truncated`; whatever parses is
//! within the bounds it was parsed against (padding included), encodes back to the bytes
//! it came from (the only byte a parse ignores is a non-REJECT record's reason byte) and
//! parses again to the same value; a header built from arbitrary fields parses back
//! exactly when it is valid. `RunFrame::parse` likewise, on the same bytes.

use arbitrary::Arbitrary;
use ringbtl::error::WireError;
use ringbtl::wire::{
    FrameKind, Header, Hello, HelloKind, RunFrame, Tag, HEADER_LEN, HELLO_LEN, PAD_ALIGN,
    PREFIX_LEN, PUT_TARGET_LEN, RUN_LEN,
};

/// One fuzz case.
#[derive(Debug, Arbitrary)]
pub struct Input {
    /// Limit for `Header::parse`.
    pub max_len: u32,
    /// A header built field by field, encoded, then parsed.
    pub fields: (bool, u8, u32),
    /// Bytes handed to both parsers.
    pub bytes: Vec<u8>,
}

/// Runs every check on `input`; panics on a violation.
pub fn run(input: &Input) {
    check_header_bytes(&input.bytes, input.max_len);
    check_hello_bytes(&input.bytes);
    check_run_bytes(&input.bytes);
    check_header_fields(input.fields, input.max_len);
}

fn check_header_bytes(b: &[u8], max_len: u32) {
    let parsed = Header::parse(b, max_len);
    if b.len() < HEADER_LEN {
        assert_eq!(parsed, Err(WireError::Truncated), "{b:02x?}");
        return;
    }
    let Ok(h) = parsed else { return };
    assert!(h.len <= max_len, "{h:?} parsed against {max_len}");
    assert!(
        h.kind != FrameKind::Fin || h.len == 0,
        "FIN with payload: {h:?}"
    );
    assert!(
        h.kind != FrameKind::Put || (h.len as usize >= PUT_TARGET_LEN && h.tag == Tag(0)),
        "PUT without its target or with a tag: {h:?}"
    );
    assert!(
        h.kind != FrameKind::Part || (h.len as usize >= PUT_TARGET_LEN && !h.ack && h.line == 0),
        "PART without its head or with a flag: {h:?}"
    );
    assert!(
        h.kind != FrameKind::Run || (h.len as usize == RUN_LEN && h.tag == Tag(0) && !h.ack),
        "RUN of another length, with a tag or a flag: {h:?}"
    );
    // With FLAG_ACK: a line offset; without, on a SEND: the padding (FLAG_PAD), a multiple
    // of 8 from 8 up to the length; on every other frame nothing.
    assert!(h.line < 64, "a line offset out of its bits: {h:?}");
    assert!(
        h.ack
            || h.line == 0
            || (h.kind == FrameKind::Send
                && usize::from(h.line) % PAD_ALIGN == 0
                && u32::from(h.line) <= h.len),
        "padding on a frame other than SEND, not a multiple of {PAD_ALIGN}, or past the length: {h:?}"
    );
    assert!(h.pad() <= h.len as usize, "padding past the length: {h:?}");
    let enc = h.to_bytes();
    assert_eq!(
        &enc[..],
        &b[..HEADER_LEN],
        "encoding differs from the input"
    );
    assert_eq!(Header::parse(&enc, max_len), Ok(h));
    assert_eq!(
        Header::parse(&enc, h.len),
        Ok(h),
        "its own length must be enough"
    );
}

/// A RUN's payload: short is `Truncated`; what parses carries a byte at least and encodes
/// back to the bytes it came from.
fn check_run_bytes(b: &[u8]) {
    let parsed = RunFrame::parse(b);
    if b.len() < RUN_LEN {
        assert_eq!(parsed, Err(WireError::Truncated), "{b:02x?}");
        return;
    }
    let Ok(r) = parsed else { return };
    assert!(r.len > 0, "an empty run: {r:?}");
    let enc = r.to_bytes();
    assert_eq!(
        &enc[HEADER_LEN..],
        &b[..RUN_LEN],
        "encoding differs from the input"
    );
    assert_eq!(Header::parse(&enc, 0).map(|h| h.kind), Ok(FrameKind::Run));
}

fn check_hello_bytes(b: &[u8]) {
    let parsed = Hello::parse(b);
    if b.len() < HELLO_LEN {
        // Magic and version are judged on the bytes there are; the rest is missing.
        let prefix = Hello::check_prefix(&b[..b.len().min(PREFIX_LEN)]);
        let want = prefix.and(Err(WireError::Truncated));
        assert_eq!(parsed.map(|_| ()), want, "{b:02x?}");
        return;
    }
    let Ok(h) = parsed else { return };
    let enc = h.to_bytes();
    let mut want = [0u8; HELLO_LEN];
    want.copy_from_slice(&b[..HELLO_LEN]);
    if !matches!(h.kind, HelloKind::Reject(_)) {
        // The reason byte means nothing outside a REJECT; it is written as zero.
        want[11] = 0;
    }
    assert_eq!(enc, want, "encoding differs from the input");
    assert_eq!(Hello::parse(&enc), Ok(h));
}

fn check_header_fields((fin, tag, len): (bool, u8, u32), max_len: u32) {
    // Of these two kinds, a SEND only may carry the ACK flag (with a line offset) or
    // padding (8-56 bytes, within its length); the tag's low bits pick which.
    let (ack, line) = if fin {
        (false, 0)
    } else if tag & 1 == 1 {
        (true, (len % 64) as u8)
    } else if tag & 2 == 2 {
        (false, 8 * (1 + (tag >> 2) % 7))
    } else {
        (false, 0)
    };
    let h = Header {
        kind: if fin { FrameKind::Fin } else { FrameKind::Send },
        tag: Tag(tag),
        len,
        ack,
        line,
    };
    let parsed = Header::parse(&h.to_bytes(), max_len);
    let valid =
        len <= max_len && (!fin || (len == 0 && tag == 0)) && (ack || u32::from(line) <= len);
    assert_eq!(parsed.is_ok(), valid, "{h:?} against {max_len}: {parsed:?}");
    if valid {
        assert_eq!(parsed, Ok(h));
    }
}
