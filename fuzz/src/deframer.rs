//! The receive cache fed a byte stream cut into arbitrary reads, as the transport drives
//! it: a read fills [`RxBuf::spare_mut`] and is recorded with [`RxBuf::commit`];
//! [`Frames::next_frame`] runs until `NeedMore`; a `Large` frame continues in its own buffer
//! ([`Frames::into_large`]) until [`Frames::large_complete`]; [`RxBuf::compact`] runs after
//! each read of the cache.
//!
//! Properties, however the stream is cut and whatever the cache capacity:
//! - no panic, and no stall: a read always has room while the stream has bytes left;
//! - the frames, and the error or the incomplete tail that ends them, are those of a
//!   one-shot reference parse of the whole stream (so with a valid stream of frames built
//!   from the input, exactly the frames that were built);
//! - memory: the cache never grows and the large-payload buffer never holds more than the
//!   maximum frame size.

use arbitrary::Arbitrary;
use ringbtl::buf::RxBuf;
use ringbtl::error::WireError;
use ringbtl::proto::deframe::{self, Frames, Next};
use ringbtl::wire::{FrameKind, Header, Hello, Tag, HEADER_LEN, HELLO_LEN};

/// Largest maximum frame size tried (keeps each case fast).
const MAX_FRAME_CAP: u32 = 1 << 16;

/// One fuzz case.
#[derive(Debug, Arbitrary)]
pub struct Input {
    /// Cache capacity, taken modulo 1024 (the cache rounds it up to a handshake record).
    pub cap: u16,
    /// Maximum frame size, taken modulo [`MAX_FRAME_CAP`] + 1.
    pub max_len: u32,
    /// Read sizes in order (0 reads one byte); once exhausted, each read takes all it can.
    pub cuts: Vec<u16>,
    /// Whether the stream starts with a handshake record, taken with `next_hello`.
    pub hello_first: bool,
    /// What the stream holds.
    pub stream: Stream,
}

/// The bytes fed to the cache.
#[derive(Debug, Arbitrary)]
pub enum Stream {
    /// Arbitrary bytes.
    Raw(Vec<u8>),
    /// A valid stream built from these frames (the maximum frame size is raised to fit).
    Frames(Vec<FrameSpec>),
}

/// A frame of a valid stream.
#[derive(Debug, Arbitrary)]
pub struct FrameSpec {
    /// FIN instead of a message (no payload then).
    pub fin: bool,
    /// Tag.
    pub tag: u8,
    /// Payload length, taken modulo [`MAX_FRAME_CAP`] + 1.
    pub len: u32,
}

/// A frame as it came out: header and payload.
type Frame = (Header, Vec<u8>);

/// How the frames of a stream end.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    /// The stream ran out (maybe in the middle of a frame).
    Incomplete,
    /// A header was refused.
    Error(WireError),
}

/// Runs every check on `input`; panics on a violation.
pub fn run(input: &Input) {
    let cap = usize::from(input.cap % 1024);
    let mut max_len = input.max_len % (MAX_FRAME_CAP + 1);
    let mut stream = Vec::new();
    let built = match &input.stream {
        // A raw stream opens with whatever record its first bytes make.
        Stream::Raw(b) => {
            stream.extend_from_slice(b);
            None
        }
        Stream::Frames(specs) => {
            if input.hello_first {
                stream.extend_from_slice(&valid_hello());
            }
            let frames = build(specs);
            for (h, p) in &frames {
                max_len = max_len.max(h.len);
                stream.extend_from_slice(&h.to_bytes());
                stream.extend_from_slice(p);
            }
            Some(frames)
        }
    };
    let want_hello = input.hello_first.then(|| Hello::parse(&stream));
    let body_start = match want_hello {
        Some(Ok(_)) => HELLO_LEN,
        _ => 0,
    };
    let want = reference(&stream[body_start..], max_len);
    if let Some(frames) = &built {
        assert_eq!(&want.0, frames, "reference parse of a built stream");
        assert_eq!(want.1, End::Incomplete);
    }
    let got = feed(&stream, cap, max_len, &input.cuts, want_hello.is_some());
    match (want_hello, got.hello) {
        (None, None) => {}
        (Some(w), Some(g)) => {
            assert_eq!(w, g, "handshake record");
            if w.is_err() {
                return;
            }
        }
        (w, g) => panic!("handshake record: want {w:?}, got {g:?}"),
    }
    assert_eq!(got.frames.len(), want.0.len(), "number of frames");
    for (i, (g, w)) in got.frames.iter().zip(&want.0).enumerate() {
        assert!(g == w, "frame {i}: got {:?}, want {:?}", g.0, w.0);
    }
    assert_eq!(got.end, want.1);
}

fn valid_hello() -> [u8; HELLO_LEN] {
    Hello::new(ringbtl::wire::HelloKind::Hello, ringbtl::PeerId(1)).to_bytes()
}

/// The frames described by `specs`, each payload a pattern of its index.
fn build(specs: &[FrameSpec]) -> Vec<Frame> {
    specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let len = if s.fin {
                0
            } else {
                s.len % (MAX_FRAME_CAP + 1)
            };
            let hdr = Header {
                kind: if s.fin {
                    FrameKind::Fin
                } else {
                    FrameKind::Send
                },
                // A FIN has no tag.
                tag: Tag(if s.fin { 0 } else { s.tag }),
                len,
                ack: false,
                line: 0,
            };
            let payload = (0..len as usize)
                .map(|j| (i.wrapping_mul(31) ^ j) as u8)
                .collect();
            (hdr, payload)
        })
        .collect()
}

/// Parses the whole stream at once.
fn reference(mut s: &[u8], max_len: u32) -> (Vec<Frame>, End) {
    let mut frames = Vec::new();
    loop {
        if s.len() < HEADER_LEN {
            return (frames, End::Incomplete);
        }
        let h = match Header::parse(s, max_len) {
            Ok(h) => h,
            Err(e) => return (frames, End::Error(e)),
        };
        let end = HEADER_LEN + h.len as usize;
        if s.len() < end {
            return (frames, End::Incomplete);
        }
        frames.push((h, s[HEADER_LEN..end].to_vec()));
        s = &s[end..];
    }
}

struct Fed {
    hello: Option<Result<Hello, WireError>>,
    frames: Vec<Frame>,
    end: End,
}

/// Feeds `stream` through a cache of `cap` bytes in reads of the sizes in `cuts`.
fn feed(stream: &[u8], cap: usize, max_len: u32, cuts: &[u16], hello_first: bool) -> Fed {
    let mut rx = deframe::cache(cap);
    let cache_bytes = rx.allocated();
    let mut spare_large = RxBuf::empty_large();
    let mut large: Option<RxBuf> = None;
    let mut fed = Fed {
        hello: None,
        frames: Vec::new(),
        end: End::Incomplete,
    };
    let mut want_hello = hello_first;
    let mut cuts = cuts.iter();
    let mut off = 0;
    while off < stream.len() {
        // One read, into the large buffer if a payload is being read there.
        let target = large.as_mut().unwrap_or(&mut rx);
        let spare = target.spare_mut();
        assert!(!spare.is_empty(), "stall: no room to read at offset {off}");
        let want = cuts.next().map_or(usize::MAX, |&c| usize::from(c).max(1));
        let n = want.min(spare.len()).min(stream.len() - off);
        spare[..n].copy_from_slice(&stream[off..off + n]);
        target.commit(n);
        off += n;
        if let Some(l) = large.as_mut() {
            let Some((h, p)) = l.large_complete() else {
                continue;
            };
            fed.frames.push((h, p.to_vec()));
            let mut l = large.take().expect("large read in progress");
            l.reset_large();
            spare_large = l;
        }
        if want_hello {
            match rx.next_hello() {
                Ok(None) => {
                    rx.compact();
                    continue;
                }
                Ok(Some(h)) => {
                    want_hello = false;
                    fed.hello = Some(Ok(h));
                }
                Err(e) => {
                    fed.hello = Some(Err(e));
                    return fed;
                }
            }
        }
        loop {
            match rx.next_frame(max_len) {
                Ok(Next::Frame(h, r)) => fed.frames.push((h, rx.bytes(r).to_vec())),
                Ok(Next::Large(h)) => {
                    assert!(
                        HEADER_LEN + h.len as usize > rx.capacity(),
                        "{h:?} fits in a cache of {}",
                        rx.capacity()
                    );
                    let spare = std::mem::replace(&mut spare_large, RxBuf::empty_large());
                    let l = rx.into_large(h, spare);
                    // The payload may start up to a line into its buffer (its place in
                    // the line, see `ringbtl::buf::LINE`).
                    assert!(
                        l.allocated() <= max_len as usize + ringbtl::buf::LINE,
                        "large buffer of {} bytes for frames of at most {max_len} (payload {})",
                        l.allocated(),
                        h.len
                    );
                    if let Some((h, p)) = l.large_complete() {
                        fed.frames.push((h, p.to_vec()));
                        let mut l = l;
                        l.reset_large();
                        spare_large = l;
                        continue;
                    }
                    large = Some(l);
                    break;
                }
                Ok(Next::NeedMore) => break,
                Err(e) => {
                    fed.end = End::Error(e);
                    return fed;
                }
            }
        }
        if large.is_none() {
            rx.compact();
        }
        assert_eq!(rx.allocated(), cache_bytes, "the cache grew");
    }
    if want_hello {
        fed.hello = Some(Err(WireError::Truncated));
    }
    fed
}
