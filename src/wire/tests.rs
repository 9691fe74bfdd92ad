//! The codec's checks: every record and header encoded and parsed back, and every
//! malformed one refused with its error.

use super::*;
use proptest::prelude::*;

#[test]
fn hello_round_trip_every_kind() {
    let kinds = [
        HelloKind::Hello,
        HelloKind::Challenge,
        HelloKind::Auth,
        HelloKind::Accept,
        HelloKind::Reject(RejectReason::Simultaneous),
        HelloKind::Reject(RejectReason::Duplicate),
        HelloKind::Reject(RejectReason::UnknownPeer),
        HelloKind::Reject(RejectReason::AuthFailed),
        HelloKind::Reject(RejectReason::ShuttingDown),
        HelloKind::Reject(RejectReason::Version),
        HelloKind::Reject(RejectReason::Unreachable),
        HelloKind::Reject(RejectReason::NoLink),
        HelloKind::Reject(RejectReason::LinksOff),
        HelloKind::Reject(RejectReason::UnknownJob),
        HelloKind::Probe,
        HelloKind::ProbeAck,
    ];
    for kind in kinds {
        let linked = matches!(
            kind,
            HelloKind::Hello | HelloKind::Challenge | HelloKind::Auth
        );
        let h = Hello {
            kind,
            version: VERSION,
            pid: PeerId(0xdead_beef),
            to: PeerId(7),
            job: 0x0102_0304_0506_0708,
            to_job: 0x1112_1314_1516_1718,
            nonce: [0x5a; NONCE_LEN],
            mac: [0xa5; MAC_LEN],
            link: if linked { 3 } else { 0 },
        };
        assert_eq!(Hello::parse(&h.to_bytes()), Ok(h));
    }
}

#[test]
fn a_link_beyond_the_most_is_refused() {
    let mut h = Hello::new(HelloKind::Hello, PeerId(1));
    h.link = (MAX_LINKS - 1) as u8;
    assert_eq!(Hello::parse(&h.to_bytes()).map(|h| h.link), Ok(h.link));
    let mut b = h.to_bytes();
    b[11] = MAX_LINKS as u8;
    assert_eq!(Hello::parse(&b), Err(WireError::BadLink(MAX_LINKS as u8)));
    // In an ACCEPT the byte means nothing and is not read.
    let mut a = Hello::new(HelloKind::Accept, PeerId(1)).to_bytes();
    a[11] = 0xff;
    assert_eq!(Hello::parse(&a).map(|h| h.link), Ok(0));
}

#[test]
fn hello_malformed() {
    let good = Hello::new(HelloKind::Hello, PeerId(1)).to_bytes();
    assert_eq!(
        Hello::parse(&good[..HELLO_LEN - 1]),
        Err(WireError::Truncated)
    );
    assert_eq!(Hello::parse(&good[..3]), Err(WireError::Truncated));
    let mut b = good;
    b[0] = b'X';
    assert_eq!(Hello::parse(&b), Err(WireError::BadMagic));
    // A wrong magic is seen as soon as its first byte is.
    assert_eq!(Hello::parse(&b[..1]), Err(WireError::BadMagic));
    let mut b = good;
    b[10] = 9;
    assert_eq!(Hello::parse(&b), Err(WireError::BadHelloKind(9)));
    let mut b = good;
    b[10] = 3;
    b[11] = 0;
    assert_eq!(Hello::parse(&b), Err(WireError::BadReason(0)));
    // An HTTP request is not one of ours.
    assert_eq!(
        Hello::parse(b"GET / HTTP/1.1\r\nHost: x\r\n"),
        Err(WireError::BadMagic)
    );
}

/// Version 1's 24-byte record (magic, version, kind, reason, pid, token): its version
/// is read from the first 10 bytes, before the rest of a version-2 record would be
/// complete; and the first 24 bytes of our records read as a version-1 record whose
/// version is 2, so that a version-1 peer reports the mismatch too.
#[test]
fn versions_tell_each_other_apart() {
    let mut v1 = [0u8; 24];
    v1[..8].copy_from_slice(&MAGIC);
    v1[8..10].copy_from_slice(&1u16.to_be_bytes());
    v1[10] = 1;
    let want = WireError::BadVersion {
        got: 1,
        ours: VERSION,
    };
    assert_eq!(Hello::check_prefix(&v1[..PREFIX_LEN]), Err(want));
    assert_eq!(Hello::check_prefix(&v1), Err(want));
    assert_eq!(Hello::parse(&v1), Err(want));
    assert_eq!(Hello::check_prefix(&v1[..9]), Ok(false));
    let ours = Hello::new(HelloKind::Reject(RejectReason::Version), PeerId(3)).to_bytes();
    assert_eq!(&ours[..8], &MAGIC);
    assert_eq!(u16::from_be_bytes([ours[8], ours[9]]), VERSION);
    assert_eq!(
        (ours[10], ours[11]),
        (3, 6),
        "REJECT(Version) at v1's offsets"
    );
    assert_eq!(&ours[12..16], &3u32.to_be_bytes());
}

/// A header of `kind`, `tag`, `flags` and `len`, parsed with a maximum of 1 MiB.
fn head(kind: u8, tag: u8, flags: u16, len: u32) -> Result<Header, WireError> {
    let mut b = [kind, tag, 0, 0, 0, 0, 0, 0];
    b[2..4].copy_from_slice(&flags.to_be_bytes());
    b[4..].copy_from_slice(&len.to_be_bytes());
    Header::parse(&b, 1 << 20)
}

#[test]
fn get_and_reply_headers_are_checked() {
    assert!(head(0x40, 0, 0, 36).is_ok());
    for (tag, flags, len) in [(0, 0, 35), (0, 0, 37), (1, 0, 36)] {
        assert_eq!(
            head(0x40, tag, flags, len),
            Err(WireError::BadGet { len, tag })
        );
    }
    // No flag is defined on a GET.
    assert_eq!(
        head(0x40, 0, FLAG_ACK, 36),
        Err(WireError::BadFlags(FLAG_ACK))
    );
    // A REPLY is shaped as a PUT: room for its target, tag 0, lent pages allowed.
    assert!(head(0x80, 0, FLAG_ACK, 16).is_ok());
    assert_eq!(
        head(0x80, 0, 0, 15),
        Err(WireError::BadPut { len: 15, tag: 0 })
    );
    assert_eq!(
        head(0x80, 2, 0, 100),
        Err(WireError::BadPut { len: 100, tag: 2 })
    );
    assert_eq!(
        head(0x80, 0, FLAG_PAD | (8 << 8), 100),
        Err(WireError::BadFlags(FLAG_PAD | (8 << 8)))
    );
    assert!(FrameKind::Reply.places() && FrameKind::Put.places() && !FrameKind::Get.places());
    assert!(FrameKind::Get.counted() && FrameKind::Reply.counted());
}

#[test]
fn part_headers_are_checked() {
    // A PART carries the message's tag, and room for its head.
    let h = head(0x03, 7, 0, 16 + 5).unwrap();
    assert_eq!((h.kind, h.tag, h.len), (FrameKind::Part, Tag(7), 21));
    assert_eq!(h.to_bytes()[..2], [0x03, 7]);
    assert_eq!(
        head(0x03, 7, 0, 15),
        Err(WireError::BadPut { len: 15, tag: 7 })
    );
    // No flag is defined on a PART (its pages are never lent, nothing pads it).
    for f in [FLAG_ACK, FLAG_PAD | (8 << 8)] {
        assert_eq!(head(0x03, 7, f, 100), Err(WireError::BadFlags(f)));
    }
    assert!(FrameKind::Part.places() && FrameKind::Part.counted());
    let p = PartHead {
        total: 3 << 20,
        offset: 1 << 20,
    };
    assert_eq!(PartHead::parse(&p.to_bytes()), Ok(p));
    assert_eq!(PartHead::parse(&[0; 15]), Err(WireError::Truncated));
}

#[test]
fn header_malformed() {
    let h = Header {
        kind: FrameKind::Send,
        tag: Tag(3),
        len: 100,
        ack: false,
        line: 0,
    };
    let b = h.to_bytes();
    assert_eq!(Header::parse(&b, 100), Ok(h));
    assert_eq!(
        Header::parse(&b, 99),
        Err(WireError::FrameTooLarge { len: 100, max: 99 })
    );
    assert_eq!(Header::parse(&b[..7], 100), Err(WireError::Truncated));
    let mut x = b;
    x[0] = 0;
    assert_eq!(Header::parse(&x, 100), Err(WireError::BadFrameKind(0)));
    let mut x = b;
    x[3] = 1;
    let acked = Header::parse(&x, 100).expect("FLAG_ACK on a SEND");
    assert!(acked.ack && acked.to_bytes() == x);
    x[3] = 2;
    assert_eq!(Header::parse(&x, 100), Err(WireError::BadFlags(2)));
    x[3] = 3;
    assert_eq!(Header::parse(&x, 100), Err(WireError::BadFlags(3)));
    // The line offset: bits 8-13, with FLAG_ACK only.
    x[2] = 0x2a;
    x[3] = 1;
    let lined = Header::parse(&x, 100).expect("a line offset with FLAG_ACK");
    assert!(lined.ack && lined.line == 42 && lined.to_bytes() == x);
    x[3] = 0;
    assert_eq!(Header::parse(&x, 100), Err(WireError::BadFlags(0x2a00)));
    x[2] = 0x40;
    x[3] = 1;
    assert_eq!(Header::parse(&x, 100), Err(WireError::BadFlags(0x4001)));
    x[2] = 0x80;
    assert_eq!(Header::parse(&x, 100), Err(WireError::BadFlags(0x8001)));
    // Padding: FLAG_PAD on a SEND without FLAG_ACK, a multiple of 8 from 8 up to the
    // length, in bits 8-13.
    for pad in [8u8, 16, 56] {
        x[2] = pad;
        x[3] = 2;
        let padded = Header::parse(&x, 100).expect("a padding");
        assert!(!padded.ack && padded.pad() == usize::from(pad) && padded.to_bytes() == x);
    }
    for (pad, flags) in [(0u8, 2u8), (4, 2), (60, 2), (63, 2), (8, 3), (8, 6)] {
        x[2] = pad;
        x[3] = flags;
        let want = u16::from_be_bytes([pad, flags]);
        assert_eq!(Header::parse(&x, 100), Err(WireError::BadFlags(want)));
    }
    let short = Header {
        len: 16,
        line: 24,
        ..h
    };
    assert_eq!(
        Header::parse(&short.to_bytes(), 100),
        Err(WireError::BadFlags(0x1802)),
        "more padding than the frame holds"
    );
    let all = Header { len: 24, ..short };
    assert_eq!(Header::parse(&all.to_bytes(), 100).map(|h| h.pad()), Ok(24));
    // A lent frame's line offset is no padding.
    assert_eq!(Header { ack: true, ..short }.pad(), 0);
    let control = |kind, tag: u8, len, ack| {
        let mut b = Header {
            kind,
            tag: Tag(0),
            len,
            ack,
            line: 0,
        }
        .to_bytes();
        b[1] = tag;
        Header::parse(&b, 100)
    };
    for kind in [FrameKind::Fin, FrameKind::Ack] {
        let bad = |len, tag| Err(WireError::ControlWithPayload { len, tag });
        assert_eq!(control(kind, 0, 5, false), bad(5, 0));
        assert_eq!(control(kind, 9, 0, false), bad(0, 9));
        assert_eq!(
            control(kind, 0, 0, true),
            Err(WireError::BadFlags(FLAG_ACK))
        );
        let mut lined = control(kind, 0, 0, false)
            .map(|h| h.to_bytes())
            .expect("bare");
        lined[2] = 0x01;
        lined[3] = 0x01;
        assert_eq!(Header::parse(&lined, 100), Err(WireError::BadFlags(0x0101)));
        lined[2] = 0x08;
        lined[3] = 0x02;
        assert_eq!(Header::parse(&lined, 100), Err(WireError::BadFlags(0x0802)));
        let ok = control(kind, 0, 0, false).expect("a bare control frame");
        assert!(ok.kind == kind && ok.len == 0 && !ok.ack);
    }
    let put = |tag: u8, len: u32| {
        let mut x = Header {
            kind: FrameKind::Put,
            tag: Tag(0),
            len,
            ack: false,
            line: 0,
        }
        .to_bytes();
        x[1] = tag;
        Header::parse(&x, 100)
    };
    assert_eq!(
        put(0, 15),
        Err(WireError::BadPut { len: 15, tag: 0 }),
        "no room for the target"
    );
    assert_eq!(put(7, 16), Err(WireError::BadPut { len: 16, tag: 7 }));
    assert!(put(0, 16).is_ok(), "a put of no data");
    let mut padded_put = put(0, 64).map(|h| h.to_bytes()).expect("a put");
    padded_put[2] = 0x08;
    padded_put[3] = 0x02;
    assert_eq!(
        Header::parse(&padded_put, 100),
        Err(WireError::BadFlags(0x0802)),
        "a put is not padded"
    );
    // u32::MAX length against the largest maximum is still only an error value.
    let mut x = b;
    x[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(Header::parse(&x, u32::MAX - 1).is_err());
}

#[test]
fn run_frames_are_checked() {
    let r = RunFrame {
        offset: 0x0102_0304_0506_0708,
        epoch: 3,
        len: 65536,
    };
    let b = r.to_bytes();
    assert_eq!(
        &b[..HEADER_LEN],
        &[0x30, 0, 0, 0, 0, 0, 0, RUN_LEN as u8],
        "kind 0x30, tag 0, no flags, length 16"
    );
    let h = Header::parse(&b, 0).expect("a RUN whatever the maximum frame");
    assert!(h.kind == FrameKind::Run && h.len as usize == RUN_LEN && !h.kind.counted());
    assert_eq!(RunFrame::parse(&b[HEADER_LEN..]), Ok(r));
    assert_eq!(
        RunFrame::parse(&b[HEADER_LEN..b.len() - 1]),
        Err(WireError::Truncated)
    );
    let empty = RunFrame { len: 0, ..r }.to_bytes();
    assert_eq!(
        RunFrame::parse(&empty[HEADER_LEN..]),
        Err(WireError::BadRun {
            len: RUN_LEN as u32,
            tag: 0
        }),
        "a run of no frame"
    );
    let mut x = b;
    x[1] = 5;
    assert_eq!(
        Header::parse(&x, 100),
        Err(WireError::BadRun { len: 16, tag: 5 })
    );
    let mut x = b;
    x[7] = 8;
    assert_eq!(
        Header::parse(&x, 100),
        Err(WireError::BadRun { len: 8, tag: 0 })
    );
    let mut x = b;
    x[3] = 1;
    assert_eq!(Header::parse(&x, 100), Err(WireError::BadFlags(1)));
}

#[test]
fn resume_frame_carries_a_count_an_epoch_and_whether_it_asks() {
    let r = ResumeFrame {
        count: 0x0102_0304_0506_0708,
        epoch: 7,
        asks: true,
    };
    let b = r.to_bytes();
    assert_eq!(
        &b[..HEADER_LEN],
        &[0x20, 0, 0, 0, 0, 0, 0, RESUME_LEN as u8],
        "kind 0x20, tag 0, no flags, length 16"
    );
    assert_eq!(&b[HEADER_LEN + 12..], &[0, 0, 0, 1]);
    let h = Header::parse(&b, 0).expect("a RESUME whatever the maximum frame");
    assert!(h.kind == FrameKind::Resume && h.len as usize == RESUME_LEN);
    assert!(!h.kind.counted());
    assert_eq!(ResumeFrame::parse(&b[HEADER_LEN..]), Ok(r));
    let answer = ResumeFrame { asks: false, ..r };
    assert_eq!(
        ResumeFrame::parse(&answer.to_bytes()[HEADER_LEN..]),
        Ok(answer)
    );
    assert_eq!(
        ResumeFrame::parse(&b[HEADER_LEN..b.len() - 1]),
        Err(WireError::Truncated)
    );
    let mut x = b;
    x[HEADER_LEN + 12] = 0x80;
    assert_eq!(
        ResumeFrame::parse(&x[HEADER_LEN..]),
        Err(WireError::BadCount { len: 16, tag: 0 }),
        "an unknown flag"
    );
    let mut x = b;
    x[7] = COUNT_LEN as u8;
    assert_eq!(
        Header::parse(&x, 100),
        Err(WireError::BadCount { len: 8, tag: 0 }),
        "a RESUME of a CONFIRM's length"
    );
}

proptest! {
    #[test]
    fn run_frame_round_trip(offset: u64, epoch: u32, len in 1..=u32::MAX) {
        let r = RunFrame { offset, epoch, len };
        let b = r.to_bytes();
        prop_assert_eq!(Header::parse(&b, 0).map(|h| h.kind), Ok(FrameKind::Run));
        prop_assert_eq!(RunFrame::parse(&b[HEADER_LEN..]), Ok(r));
    }

    #[test]
    fn header_round_trip(tag: u8, len: u32, kind in 0..6u8, ack: bool, line in 0..64u8) {
        let line = if ack { line } else { 0 };
        let h = match kind {
            0 => Header { kind: FrameKind::Send, tag: Tag(tag), len, ack, line },
            1 => Header { kind: FrameKind::Fin, tag: Tag(0), len: 0, ack: false, line: 0 },
            2 => Header { kind: FrameKind::Ack, tag: Tag(0), len: 0, ack: false, line: 0 },
            3 => Header { kind: FrameKind::Get, tag: Tag(0), len: GET_LEN as u32, ack: false, line: 0 },
            4 => Header { kind: FrameKind::Reply, tag: Tag(0), len: len.max(16), ack, line },
            _ => Header { kind: FrameKind::Put, tag: Tag(0), len: len.max(16), ack, line },
        };
        prop_assert_eq!(Header::parse(&h.to_bytes(), u32::MAX), Ok(h));
    }

    /// The small send's header from one store is the general encoding's.
    #[test]
    fn send_head_is_to_bytes(tag: u8, len: u32) {
        let h = Header { kind: FrameKind::Send, tag: Tag(tag), len, ack: false, line: 0 };
        prop_assert_eq!(Header::send_head(Tag(tag), len), h.to_bytes());
    }

    #[test]
    fn padded_send_round_trip(tag: u8, len in 56..u32::MAX, pad in 1..8u8) {
        let h = Header { kind: FrameKind::Send, tag: Tag(tag), len, ack: false, line: pad * 8 };
        let back = Header::parse(&h.to_bytes(), u32::MAX);
        prop_assert_eq!(back, Ok(h));
        prop_assert_eq!(h.pad(), usize::from(pad) * 8);
    }

    /// The fast path of the common frame decides as the general parse does.
    #[test]
    fn fast_and_general_parse_agree(
        b: [u8; HEADER_LEN],
        kind in prop_oneof![Just(FrameKind::SEND), any::<u8>()],
        flags in prop_oneof![Just(0u16), any::<u16>()],
        max_len: u32,
    ) {
        let mut b = b;
        b[0] = kind;
        b[2..4].copy_from_slice(&flags.to_be_bytes());
        prop_assert_eq!(Header::parse(&b, max_len), Header::parse_any(&b, max_len));
        prop_assert_eq!(Header::parse(&b, u32::MAX), Header::parse_any(&b, u32::MAX));
    }

    #[test]
    fn get_request_round_trip(k1: u64, a1: u64, len: u32, k2: u64, a2: u64) {
        let r = GetRequest {
            from: PutTarget { key: k1, addr: a1 },
            len,
            to: PutTarget { key: k2, addr: a2 },
        };
        prop_assert_eq!(GetRequest::parse(&r.to_bytes()), Ok(r));
        prop_assert_eq!(GetRequest::parse(&r.to_bytes()[..GET_LEN - 1]), Err(WireError::Truncated));
    }

    #[test]
    fn put_target_round_trip(key: u64, addr: u64) {
        let t = PutTarget { key, addr };
        prop_assert_eq!(PutTarget::parse(&t.to_bytes()), Ok(t));
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..100)) {
        let _ = Header::parse(&b, 1 << 20);
        let _ = Hello::parse(&b);
        let _ = Hello::check_prefix(&b);
    }
}
