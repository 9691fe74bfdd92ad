//! Wire format: the handshake record and the frame header. Pure data, no I/O.
//!
//! All integers are big-endian (network order).
//!
//! # Handshake record (24 bytes), the first bytes each side sends on a new connection
//!
//! ```text
//!  0        8        10    11      12          16                  24
//!  +--------+--------+-----+-------+-----------+-------------------+
//!  | magic  |version |kind |reason | process id|     job token     |
//!  | 8 B    | u16    | u8  | u8    | u32       |     u64           |
//!  +--------+--------+-----+-------+-----------+-------------------+
//! ```
//!
//! The dialer sends `HELLO` (kind 1); the acceptor answers `ACCEPT` (2: the connection is
//! then open) or `REJECT` (3) with a [`RejectReason`] and closes. A prober sends `PROBE`
//! (4) and gets `PROBE_ACK` (5) carrying the listener's process id, then the acceptor
//! closes; no endpoint is created. A wrong magic means "not one of ours":
//! the acceptor closes that socket without answering.
//!
//! # Frame header (8 bytes), before every message once the handshake is done
//!
//! ```text
//!  0     1     2        4                8
//!  +-----+-----+--------+----------------+
//!  |kind | tag | flags  | payload length |
//!  | u8  | u8  | u16 =0 | u32            |
//!  +-----+-----+--------+----------------+
//! ```
//!
//! `kind` is [`FrameKind::Send`] (an active message for `tag`) or [`FrameKind::Fin`] (the
//! sender closes cleanly; no payload). A length above the receiver's configured maximum
//! frame size is a protocol error on that connection, never an allocation.

/// Malformed bytes in a handshake record or frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the fixed length.
    #[error("truncated record")]
    Truncated,
    /// The handshake does not start with ringbtl's magic: not one of ours.
    #[error("bad magic: not a ringbtl peer")]
    BadMagic,
    /// Unknown handshake record kind.
    #[error("unknown handshake kind {0}")]
    BadHelloKind(u8),
    /// Unknown reject reason code.
    #[error("unknown reject reason {0}")]
    BadReason(u8),
    /// Unknown frame kind.
    #[error("unknown frame kind {0:#04x}")]
    BadFrameKind(u8),
    /// Reserved flag bits set.
    #[error("reserved header flags set: {0:#06x}")]
    BadFlags(u16),
    /// Payload longer than the configured maximum frame size.
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    FrameTooLarge {
        /// Announced length.
        len: u32,
        /// Configured maximum.
        max: u32,
    },
    /// A FIN frame announced a payload.
    #[error("FIN frame with a {0}-byte payload")]
    FinWithPayload(u32),
}

/// The magic that opens every ringbtl handshake record.
pub const MAGIC: [u8; 8] = *b"RINGBTL\0";
/// Protocol version this build speaks.
pub const VERSION: u16 = 0x0001;
/// Length of the handshake record.
pub const HELLO_LEN: usize = 24;
/// Job token of a process not told otherwise (`RINGBTL_JOB_TOKEN`): the magic's bytes
/// read as a big-endian integer.
pub const DEFAULT_TOKEN: u64 = 0x5249_4e47_4254_4c00;
/// Length of the frame header.
pub const HEADER_LEN: usize = 8;

/// An active-message tag: index into the 256-slot handler table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(pub u8);

/// A job-unique process identifier (the rank, for MPI-like jobs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);

impl std::fmt::Display for PeerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "peer {}", self.0)
    }
}

/// What a handshake record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloKind {
    /// Dialer to acceptor: "I am `pid` of job `token`".
    Hello,
    /// Acceptor to dialer: the connection is adopted.
    Accept,
    /// Acceptor to dialer: the connection is refused; it will be closed.
    Reject(RejectReason),
    /// A prober asks "is a ringbtl process listening here?"; no endpoint is created.
    Probe,
    /// Answer to a probe: the record's process id says who listens.
    ProbeAck,
}

/// Why an acceptor refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// Both sides dialed at once and the other connection wins (the dialer with the lower
    /// process id wins). The refused dialer keeps its queue and waits for the winner.
    Simultaneous,
    /// A connection with this peer is already open.
    Duplicate,
    /// The process id is not a peer this process knows.
    UnknownPeer,
    /// The job token does not match.
    BadToken,
    /// The acceptor is shutting down.
    ShuttingDown,
    /// The protocol versions differ.
    Version,
    /// This process declared the dialer failed earlier; it stays unreachable.
    Unreachable,
}

impl RejectReason {
    fn code(self) -> u8 {
        match self {
            Self::Simultaneous => 1,
            Self::Duplicate => 2,
            Self::UnknownPeer => 3,
            Self::BadToken => 4,
            Self::ShuttingDown => 5,
            Self::Version => 6,
            Self::Unreachable => 7,
        }
    }

    fn from_code(c: u8) -> Result<Self, WireError> {
        Ok(match c {
            1 => Self::Simultaneous,
            2 => Self::Duplicate,
            3 => Self::UnknownPeer,
            4 => Self::BadToken,
            5 => Self::ShuttingDown,
            6 => Self::Version,
            7 => Self::Unreachable,
            _ => return Err(WireError::BadReason(c)),
        })
    }
}

/// A parsed handshake record. Once it exists, its magic and kind were valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Record kind.
    pub kind: HelloKind,
    /// Protocol version of the sender.
    pub version: u16,
    /// Sender's process id.
    pub pid: PeerId,
    /// Sender's job token.
    pub token: u64,
}

impl Hello {
    /// Parses the first [`HELLO_LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b: &[u8; HELLO_LEN] = buf
            .get(..HELLO_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(WireError::Truncated)?;
        if b[0..8] != MAGIC {
            return Err(WireError::BadMagic);
        }
        let version = u16::from_be_bytes([b[8], b[9]]);
        let kind = match b[10] {
            1 => HelloKind::Hello,
            2 => HelloKind::Accept,
            3 => HelloKind::Reject(RejectReason::from_code(b[11])?),
            4 => HelloKind::Probe,
            5 => HelloKind::ProbeAck,
            k => return Err(WireError::BadHelloKind(k)),
        };
        Ok(Self {
            kind,
            version,
            pid: PeerId(u32::from_be_bytes([b[12], b[13], b[14], b[15]])),
            token: u64::from_be_bytes(b[16..24].try_into().expect("8-byte slice")),
        })
    }

    /// Writes the record into `out`.
    pub fn emit(&self, out: &mut [u8; HELLO_LEN]) {
        out[0..8].copy_from_slice(&MAGIC);
        out[8..10].copy_from_slice(&self.version.to_be_bytes());
        let (k, r) = match self.kind {
            HelloKind::Hello => (1, 0),
            HelloKind::Accept => (2, 0),
            HelloKind::Reject(r) => (3, r.code()),
            HelloKind::Probe => (4, 0),
            HelloKind::ProbeAck => (5, 0),
        };
        out[10] = k;
        out[11] = r;
        out[12..16].copy_from_slice(&self.pid.0.to_be_bytes());
        out[16..24].copy_from_slice(&self.token.to_be_bytes());
    }

    /// The record as an array.
    pub fn to_bytes(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        self.emit(&mut b);
        b
    }
}

/// Frame kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// An active message for the header's tag.
    Send,
    /// Clean close: the sender sends nothing more on this connection.
    Fin,
}

impl FrameKind {
    const SEND: u8 = 0x01;
    const FIN: u8 = 0x04;
}

/// A parsed frame header: `len` is within the maximum it was parsed against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Frame kind.
    pub kind: FrameKind,
    /// Active-message tag.
    pub tag: Tag,
    /// Payload length in bytes.
    pub len: u32,
}

impl Header {
    /// Length of the encoded header.
    pub const LEN: usize = HEADER_LEN;

    /// Parses a header, rejecting unknown kinds, nonzero flags, a FIN with a payload and
    /// any length above `max_len`.
    pub fn parse(buf: &[u8], max_len: u32) -> Result<Self, WireError> {
        let b: &[u8; HEADER_LEN] = buf
            .get(..HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(WireError::Truncated)?;
        let kind = match b[0] {
            FrameKind::SEND => FrameKind::Send,
            FrameKind::FIN => FrameKind::Fin,
            k => return Err(WireError::BadFrameKind(k)),
        };
        let flags = u16::from_be_bytes([b[2], b[3]]);
        if flags != 0 {
            return Err(WireError::BadFlags(flags));
        }
        let len = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
        if len > max_len {
            return Err(WireError::FrameTooLarge { len, max: max_len });
        }
        if kind == FrameKind::Fin && len != 0 {
            return Err(WireError::FinWithPayload(len));
        }
        Ok(Self {
            kind,
            tag: Tag(b[1]),
            len,
        })
    }

    /// Encodes the header.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let k = match self.kind {
            FrameKind::Send => FrameKind::SEND,
            FrameKind::Fin => FrameKind::FIN,
        };
        let l = self.len.to_be_bytes();
        [k, self.tag.0, 0, 0, l[0], l[1], l[2], l[3]]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hello_round_trip_every_kind() {
        let kinds = [
            HelloKind::Hello,
            HelloKind::Accept,
            HelloKind::Reject(RejectReason::Simultaneous),
            HelloKind::Reject(RejectReason::Duplicate),
            HelloKind::Reject(RejectReason::UnknownPeer),
            HelloKind::Reject(RejectReason::BadToken),
            HelloKind::Reject(RejectReason::ShuttingDown),
            HelloKind::Reject(RejectReason::Version),
            HelloKind::Reject(RejectReason::Unreachable),
            HelloKind::Probe,
            HelloKind::ProbeAck,
        ];
        for kind in kinds {
            let h = Hello {
                kind,
                version: VERSION,
                pid: PeerId(0xdead_beef),
                token: 0x0123_4567_89ab_cdef,
            };
            assert_eq!(Hello::parse(&h.to_bytes()), Ok(h));
        }
    }

    #[test]
    fn hello_malformed() {
        let good = Hello {
            kind: HelloKind::Hello,
            version: VERSION,
            pid: PeerId(1),
            token: 7,
        }
        .to_bytes();
        assert_eq!(Hello::parse(&good[..23]), Err(WireError::Truncated));
        let mut b = good;
        b[0] = b'X';
        assert_eq!(Hello::parse(&b), Err(WireError::BadMagic));
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

    #[test]
    fn header_malformed() {
        let h = Header {
            kind: FrameKind::Send,
            tag: Tag(3),
            len: 100,
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
        assert_eq!(Header::parse(&x, 100), Err(WireError::BadFlags(1)));
        let fin = Header {
            kind: FrameKind::Fin,
            tag: Tag(0),
            len: 5,
        }
        .to_bytes();
        assert_eq!(Header::parse(&fin, 100), Err(WireError::FinWithPayload(5)));
        // u32::MAX length against the largest maximum is still only an error value.
        let mut x = b;
        x[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(Header::parse(&x, u32::MAX - 1).is_err());
    }

    proptest! {
        #[test]
        fn header_round_trip(tag: u8, len: u32, fin: bool) {
            let h = Header {
                kind: if fin { FrameKind::Fin } else { FrameKind::Send },
                tag: Tag(tag),
                len: if fin { 0 } else { len },
            };
            prop_assert_eq!(Header::parse(&h.to_bytes(), u32::MAX), Ok(h));
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = Header::parse(&b, 1 << 20);
            let _ = Hello::parse(&b);
        }
    }
}
