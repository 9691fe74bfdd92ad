//! Wire format: the handshake record and the frame header. Pure data, no I/O.
//!
//! All integers are big-endian (network order).
//!
//! # Handshake record (100 bytes), the first bytes each side sends on a new connection
//!
//! ```text
//!  0       8       10   11     12        16        20        28        36       68      100
//!  +-------+-------+----+------+---------+---------+---------+---------+--------+-------+
//!  | magic |version|kind|reason| process | address-| job     | address-| nonce  |  MAC  |
//!  | 8 B   | u16   | u8 | /link| id u32  | ee u32  | u64     | ee's job|  32 B  |  32 B |
//!  +-------+-------+----+------+---------+---------+---------+---------+--------+-------+
//! ```
//!
//! A process is named by its job (the job token, `RINGBTL_JOB_TOKEN`) and its process id
//! within the job. The sender states both of its own, and both of the process it
//! addresses (`HELLO`, `CHALLENGE`, `AUTH`); a connection between two jobs is one whose
//! two jobs differ (see "Between jobs" below).
//!
//! Byte 11 is the reason of a `REJECT`, and the *link* of a `HELLO`, `CHALLENGE` or `AUTH`
//! (0 in every other record): which of the endpoint's connections the dial is to be. Link
//! 0 is the endpoint's first connection, opened and raced as the state machine says; a
//! dial for link 1 or above *joins* an endpoint that already has its first connection
//! (see [`Hello::link`]). The acceptor's `CHALLENGE` repeats the link it read, and both
//! MACs cover it.
//!
//! Magic and version come first and stay at these offsets in every version (the 24-byte
//! record of version 1 had them there too), so that two versions tell each other apart
//! after 10 bytes: a record whose version is not ours is refused with `REJECT(Version)`
//! (or fails the dial) with an error naming both versions, without waiting for the rest.
//!
//! # The handshake: mutual challenge-response over the job key
//!
//! ```text
//!  dialer d                                               acceptor a
//!  HELLO     (pid_d, addressee pid_a, nonce Nd)      ──▶
//!                                                    ◀──  CHALLENGE (pid_a, addressee pid_d,
//!                                                                    nonce Na, MAC_a)
//!  verifies MAC_a, then
//!  AUTH      (pid_d, addressee pid_a, MAC_d)         ──▶
//!  [first frames, when pid_d < pid_a]                ──▶
//!                                                         verifies MAC_d, then decides:
//!                                                    ◀──  ACCEPT, or REJECT(reason)
//! ```
//!
//! A dialer whose id is below the acceptor's (the side whose dial survives a simultaneous
//! connect) writes its first frames right behind its AUTH instead of a round trip later;
//! the acceptor reads them only once MAC_d verified and it adopted the connection, and a
//! connection it refuses is closed with them unread (the dialer sends them again on its
//! next connection).
//!
//! `MAC_x = HMAC-SHA-256(K, label_x | version | job_d | job_a | Nd | Na | pid_d | pid_a |
//! link)` (see [`auth::handshake_mac`](crate::auth::handshake_mac)), with `K` the job key,
//! `label_a = "ringbtl acceptor"`, `label_d = "ringbtl dialer\0\0"` and `job_d`, `job_a`
//! the dialer's and the acceptor's jobs (the same within a job). The labels differ, so a MAC reflected back to its author proves nothing; both
//! nonces are fresh per connection, so a recorded handshake replays nowhere; the key never
//! crosses the wire. The dialer sends nothing after HELLO until the acceptor proved the
//! key, and the acceptor takes no decision (an endpoint's state, a rank slot) before the
//! dialer proved it: only an authenticated peer claims a process id. A verification that
//! fails ends the handshake with `REJECT(AuthFailed)`.
//!
//! The job token (`RINGBTL_JOB_TOKEN`) is a job's name, not a secret: records carry it,
//! and the MACs cover it. Without a job key both sides use
//! [`auth::PUBLIC_KEY`](crate::auth::PUBLIC_KEY) (the same exchange, one code path); it
//! separates jobs by token and version only and authenticates nothing, which the
//! transport says once on stderr.
//!
//! # Between jobs
//!
//! Two jobs that are to talk (a job and the job it spawned, two jobs that connected) each
//! learn the other's *public* job key (an X25519 public key derived from the job key,
//! [`JobKey::public`](crate::auth::JobKey::public)) through their launcher, and each
//! derives the same pair key from its own job key and the other's public key
//! ([`auth::pair_key`](crate::auth::pair_key)): no secret crosses the network, and one job
//! never learns the other's job key. A connection between them runs the same handshake
//! with `K` the pair key. An acceptor that does not (yet) know the dialer's job answers
//! its HELLO with `REJECT(UnknownJob)`, which the dialer takes as "not yet": it retries
//! until its connect timeout (the two jobs add each other at about the same time).
//!
//! `REJECT` carries its reason only, `ACCEPT` nothing; nonce and MAC are zero in both. A
//! prober sends `PROBE` (kind 4) and gets `PROBE_ACK` (5), which says only "alive" and the
//! listener's process id (nothing secret), then the acceptor closes; no endpoint is
//! created. A wrong magic means "not one of ours": the acceptor closes that socket without
//! answering.
//!
//! # Frame header (8 bytes), before every message once the handshake is done
//!
//! ```text
//!  0     1     2        4                8
//!  +-----+-----+--------+----------------+
//!  |kind | tag | flags  | payload length |
//!  | u8  | u8  | u16    | u32            |
//!  +-----+-----+--------+----------------+
//! ```
//!
//! `kind` is [`FrameKind::Send`] (an active message for `tag`), [`FrameKind::Put`] (data
//! for a region the receiver registered; see below), [`FrameKind::Ack`] (see below; no
//! payload) or [`FrameKind::Fin`] (the sender closes cleanly; no payload). A length above
//! the receiver's configured maximum frame size is a protocol error on that connection,
//! never an allocation. The flags are defined on SEND and PUT only: [`FLAG_ACK`] (bit 0)
//! and, with it, the payload's line offset (bits 8-13, [`FLAG_LINE_MASK`]; see below);
//! on a SEND without [`FLAG_ACK`], [`FLAG_PAD`] (bit 1) and, with it, the number of padding
//! bytes in the same bits (see below); every other bit must be zero.
//!
//! # ACK: the receiver has read a frame whose pages the sender lent
//!
//! A large payload may leave without being copied: the sender hands the kernel its pages
//! (`vmsplice` into a pipe, `splice` into the socket), and the kernel reads them until the
//! receiver has read the bytes (on loopback the very pages sit in the receiver's socket
//! queue). The sender then sets [`FLAG_ACK`] in the frame's header, and the receiver
//! answers each such frame, once it has read all of it, with an ACK frame (kind 8, tag 0,
//! no flags, no payload); ACKs come in the order of the frames they answer. Only then does
//! the sender report the send complete and the caller get its buffer back. An ACK that
//! answers no frame is a protocol error.
//!
//! Such a frame also says where its payload starts within a 64-byte line of the sender's
//! memory (the address of its first byte modulo 64; [`Header::line`]). The receiver's
//! kernel copies straight from those pages into the receiver's buffer, and the x86 string
//! copy it uses runs several times slower when the destination lies 1 to 32 bytes past
//! the source modulo 4 KiB (the loads then seem to depend on the stores just made): the
//! receiver places the payload at the same offset of a line (rounded down to 8 bytes),
//! which keeps the two at most 7 bytes apart in the other direction.
//!
//! # Padding: where a copied payload lands in the sender's socket pages
//!
//! ```text
//!  0        8             8 + pad                8 + length
//!  +--------+-------------+-----------------------+
//!  | header | padding     | payload               |
//!  | PAD    | (ignored)   | (length - pad bytes)  |
//!  +--------+-------------+-----------------------+
//! ```
//!
//! A payload the sender's kernel copies meets the same slow copy on the way out: the
//! kernel copies each write into fresh socket pages (an idle socket's start at offset 0),
//! header first, so a payload read from 0 to 7 bytes into a page, as `malloc` hands out
//! large buffers, lands 1 to 8 bytes past its source. A SEND whose payload is copied may
//! therefore carry [`FLAG_PAD`] with a number of padding bytes (a multiple of 8, from 8 to
//! 56, at most the frame's length) in bits 8-13: that many bytes after the header are not
//! the payload, and `length` counts them. The sender chooses them so that the payload's
//! largest segment lands in the socket pages at most 7 bytes before its own offset in a
//! line ([`Header::pad`]); the receiver places what follows the header one header past the
//! start of a line as for any copied payload, and hands out the payload behind the
//! padding, still 8-byte aligned.
//!
//! # Links: CONFIRM and RESUME
//!
//! An endpoint with more than one connection keeps one stream of frames per direction,
//! carried by its *primary* connection, the others standing by (see `Hello::link`).
//! Every frame but these two counts in its stream's position. While a standby link is
//! open, the receiver says how many of the peer's frames it has consumed with a CONFIRM
//! (kind 0x10, tag 0, no flags, length 8, the count as a big-endian u64), and the sender
//! keeps each frame until it is confirmed. A frame of at most [`KEEP_COPY_MAX`] bytes
//! after its header is kept as a copy, and its send completes at its write; a longer one
//! is kept by reference to the caller's memory, and its send completes at its
//! confirmation. So a receiver writes its CONFIRM at once only when a sender may wait
//! for it (it consumed a frame longer than [`KEEP_COPY_MAX`] or a FIN since its last
//! count), or to bound what the sender keeps (past 32 KiB consumed); otherwise the count
//! goes with the next frames it writes anyway (the answer of a ping-pong), not in a write
//! of its own. When the primary fails, one side writes a
//! RESUME with its own count as the first frame on a standby link; the other side answers
//! on that link with a RESUME of its count, and each sends again, on that link, its
//! frames from the count it read. Counts start at 0 on the endpoint's first connection
//! and go on across RESUMEs.
//!
//! ```text
//!  0        8                16       20
//!  +--------+----------------+--------+--------+
//!  | header | count          | epoch  | flags  |
//!  | 0x20   | u64            | u32    | u32    |
//!  | tag 0  |                |        |        |
//!  +--------+----------------+--------+--------+
//! ```
//!
//! A RESUME (kind 0x20, tag 0, no header flags, length [`RESUME_LEN`]; [`ResumeFrame`])
//! carries, besides the count, the epoch its writer starts for the stream it receives
//! (see "Runs": one more than its last, from 0) and, in bit 0 of its flags
//! ([`RESUME_ASKS`]), whether it *asks*: set when its writer starts a failover, clear when
//! it answers one. The other flag bits are 0. An engine that spreads no stream writes
//! both and acts on neither.
//!
//! # Runs: RUN
//!
//! ```text
//!  0        8                16       20       24
//!  +--------+----------------+--------+--------+
//!  | header | offset         | epoch  | length |
//!  | 0x30   | u64            | u32    | u32    |
//!  | tag 0  |                |        |        |
//!  +--------+----------------+--------+--------+
//! ```
//!
//! A stream spread over several links is cut into *runs*: consecutive counted frames of
//! the stream, each run written whole on one link behind a RUN frame (kind 0x30, tag 0,
//! no flags, length [`RUN_LEN`]; [`RunFrame`]), which is not counted, like CONFIRM and
//! RESUME. `offset` is where the run starts in the stream of its epoch, in frames;
//! `length` how many frames follow on that link (at least 1). A run never cuts a frame:
//! a large payload is spread as several frames (a PUT as PUTs of its pieces, a message as
//! PARTs). The *epoch* of a stream is 0 from the endpoint's first connection and grows by
//! one at each RESUME
//! its receiver writes, which names it; offsets count from the epoch's first frame
//! (frame 0, or the count the RESUME carried). The receiver takes the frames of the link
//! whose run starts at the offset it has reached, and drops the frames of a run of an
//! older epoch (its length says how many). Frames of epoch 0 written before the sender's
//! first RUN go without one, on the first link, as with one link; from its first RUN of
//! an epoch on, and in every epoch after 0, the sender writes every counted frame in a
//! run. An endpoint with one link sends no RUN.
//!
//! # Put (one-sided write into registered memory)
//!
//! ```text
//!  0        8                16               24
//!  +--------+----------------+----------------+-------------------
//!  | header | region key     | address        | data (length - 16)
//!  | kind 2 | u64            | u64            |
//!  | tag 0  |                |                |
//!  +--------+----------------+----------------+-------------------
//! ```
//!
//! The receiver wrote nothing to memory it did not register: the key must name one of
//! its live regions (index and generation, [`PutTarget`]) and `address .. address + data`
//! must lie inside it, or the frame is a protocol error on that connection. The data goes
//! from the socket straight into the region; no handler runs on the receiver. Frames to
//! one peer keep their order, so a message sent after a put tells the receiver that the
//! put's data is in place.
//!
//! # Parts (an active message cut over links)
//!
//! ```text
//!  0        8                16               24
//!  +--------+----------------+----------------+-------------------
//!  | header | total          | offset         | piece (length - 16)
//!  | 0x03   | u64            | u64            |
//!  | tag    |                |                |
//!  +--------+----------------+----------------+-------------------
//! ```
//!
//! A message too large to spread as one frame may go as PART frames (kind 0x03, its
//! tag, no flags, [`PartHead`]): consecutive counted frames of the stream, each `length -
//! 16` bytes of the message at `offset`, the first at 0, each starting where the one
//! before ended, all with the message's tag and `total`, its length (at most the
//! receiver's maximum frame size). The receiver places each piece where it belongs in a
//! buffer of `total` bytes, from the socket straight into it, and hands the message to
//! the tag's handler once its last byte is in: to the handler, a message sent in parts
//! is the message. Other frames may come between two parts (the sender's ACKs and
//! REPLYs); a PART that does not continue the message is a protocol error.
//!
//! # Get (one-sided read of registered memory)
//!
//! ```text
//!  0        8            16           24     28           36           44
//!  +--------+------------+------------+------+------------+------------+
//!  | header | source key | source     | data | reply key  | reply      |
//!  | 0x40   | u64        | address    | u32  | u64        | address    |
//!  | tag 0  |            | u64        |      |            | u64        |
//!  +--------+------------+------------+------+------------+------------+
//! ```
//!
//! A GET (kind 0x40, tag 0, no flags, length [`GET_LEN`]) asks the receiver for `data`
//! bytes of a region it registered ([`GetRequest`]); the same checks as a put's make a
//! source outside its regions a protocol error. The receiver answers with a REPLY (kind
//! 0x80), shaped as a PUT, whose target is the GET's reply key and address and whose data
//! are the bytes asked for, read straight from the region. REPLYs come in the order of
//! the GETs they answer; one that answers no GET, or whose target or length is not the
//! GET's, is a protocol error.

/// Malformed bytes in a handshake record or frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the fixed length.
    #[error("truncated record")]
    Truncated,
    /// The handshake does not start with ringbtl's magic: not one of ours.
    #[error("bad magic: not a ringbtl peer")]
    BadMagic,
    /// A handshake record of another protocol version (read from its first 10 bytes).
    #[error("protocol version {got:#06x}, we speak {ours:#06x}")]
    BadVersion {
        /// The sender's version.
        got: u16,
        /// Ours.
        ours: u16,
    },
    /// Unknown handshake record kind.
    #[error("unknown handshake kind {0}")]
    BadHelloKind(u8),
    /// Unknown reject reason code.
    #[error("unknown reject reason {0}")]
    BadReason(u8),
    /// A handshake record names a link beyond [`MAX_LINKS`].
    #[error("link {0} of a handshake record is beyond the most an endpoint has")]
    BadLink(u8),
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
    /// A FIN or ACK frame announced a payload or a tag.
    #[error("control frame (FIN, ACK) with a {len}-byte payload and tag {tag}")]
    ControlWithPayload {
        /// Announced length.
        len: u32,
        /// Tag byte.
        tag: u8,
    },
    /// A PUT frame whose target is not inside memory the receiver registered.
    #[error("PUT of {len} bytes at {addr:#x} for region {key:#x}: not inside a registered region")]
    PutOutsideRegions {
        /// The target's region key.
        key: u64,
        /// The target's address.
        addr: u64,
        /// Data bytes.
        len: u64,
    },
    /// A CONFIRM or RESUME frame whose length is not that of its kind, or with a tag or
    /// header flags, or a RESUME with an unknown flag.
    #[error("count frame (CONFIRM, RESUME) with a {len}-byte payload and tag {tag}")]
    BadCount {
        /// Announced length.
        len: u32,
        /// Tag byte.
        tag: u8,
    },
    /// A PUT or REPLY frame too short for its target, or with a tag; a PART too short for
    /// its head.
    #[error("PUT, REPLY or PART frame with a {len}-byte payload and tag {tag} (a head of 16 bytes, and tag 0 but on a PART, expected)")]
    BadPut {
        /// Announced length.
        len: u32,
        /// Tag byte.
        tag: u8,
    },
    /// A RUN frame whose length is not [`RUN_LEN`], with a tag or flags, or that carries
    /// no byte of the stream.
    #[error("RUN frame with a {len}-byte payload and tag {tag}, or an empty run")]
    BadRun {
        /// Announced length.
        len: u32,
        /// Tag byte.
        tag: u8,
    },
    /// A PART that does not continue the message its sender is cutting: a piece that does
    /// not start where the pieces taken so far end (or the first, at 0, when none is
    /// being taken), of another tag or total than the message's, empty, or ending past
    /// a total larger than the largest frame.
    #[error("PART of {len} bytes at {offset} of a {total}-byte message: not the next piece")]
    BadPart {
        /// The message's length the PART announces.
        total: u64,
        /// Where the piece starts in it.
        offset: u64,
        /// The piece's bytes.
        len: u64,
    },
    /// A GET frame whose length is not that of its request, or with a tag or flags.
    #[error("GET frame with a {len}-byte payload and tag {tag} (a request of 36 bytes and tag 0 expected)")]
    BadGet {
        /// Announced length.
        len: u32,
        /// Tag byte.
        tag: u8,
    },
}

/// The magic that opens every ringbtl handshake record.
pub const MAGIC: [u8; 8] = *b"RINGBTL\0";
/// Protocol version this build speaks (12: the jobs of both ends in the handshake record
/// and its MACs; 11: PART frames; 10: runs counted in frames; 9: RUN frames; 8: GET and
/// REPLY frames; 7: the link byte of the handshake, in the MACs; 6: padding before copied
/// payloads; 5: the line offset of lent payloads; 4: the ACK flag and frame; 3: PUT
/// frames; 2: the authenticated handshake; 1 had a 24-byte record that carried the job
/// token).
pub const VERSION: u16 = 0x000c;
/// Length of the handshake record.
pub const HELLO_LEN: usize = 100;
/// Bytes of a handshake record that identify its protocol: magic and version.
pub const PREFIX_LEN: usize = 10;
/// Length of a handshake nonce.
pub const NONCE_LEN: usize = 32;
/// Length of a handshake MAC.
pub const MAC_LEN: usize = 32;
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

impl PeerId {
    /// "Whoever listens there": the addressee of a record whose sender does not know it
    /// (a probe), and the process id of a prober.
    pub const ANY: PeerId = PeerId(u32::MAX);
}

impl std::fmt::Display for PeerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "peer {}", self.0)
    }
}

/// What a handshake record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloKind {
    /// Dialer to acceptor: "I am `pid`, I want `to`; here is my nonce".
    Hello,
    /// Acceptor to dialer: its nonce and its proof of the key (MAC_a).
    Challenge,
    /// Dialer to acceptor: its proof of the key (MAC_d).
    Auth,
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
    /// The peer could not prove that it holds the job key (or its job token differs).
    AuthFailed,
    /// The acceptor is shutting down.
    ShuttingDown,
    /// The protocol versions differ.
    Version,
    /// This process declared the dialer failed earlier; it stays unreachable.
    Unreachable,
    /// A dial to join the endpoint (link 1 or above) found it without a first connection:
    /// the dialer tries again later, or dials link 0.
    NoLink,
    /// This process takes no links beyond an endpoint's first (its receive mode has no
    /// room for them): the dialer dials none to it.
    LinksOff,
    /// The dialer's job is not one this process (yet) talks to: the dialer retries until
    /// its connect timeout (see "Between jobs" in the module docs).
    UnknownJob,
}

impl RejectReason {
    fn code(self) -> u8 {
        match self {
            Self::Simultaneous => 1,
            Self::Duplicate => 2,
            Self::UnknownPeer => 3,
            Self::AuthFailed => 4,
            Self::ShuttingDown => 5,
            Self::Version => 6,
            Self::Unreachable => 7,
            Self::NoLink => 8,
            Self::LinksOff => 9,
            Self::UnknownJob => 10,
        }
    }

    fn from_code(c: u8) -> Result<Self, WireError> {
        Ok(match c {
            1 => Self::Simultaneous,
            2 => Self::Duplicate,
            3 => Self::UnknownPeer,
            4 => Self::AuthFailed,
            5 => Self::ShuttingDown,
            6 => Self::Version,
            7 => Self::Unreachable,
            8 => Self::NoLink,
            9 => Self::LinksOff,
            10 => Self::UnknownJob,
            _ => return Err(WireError::BadReason(c)),
        })
    }
}

/// A parsed handshake record. Once it exists, its magic, version and kind were valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Record kind.
    pub kind: HelloKind,
    /// Protocol version of the sender (always [`VERSION`] once parsed).
    pub version: u16,
    /// Sender's process id.
    pub pid: PeerId,
    /// The process the sender addresses ([`PeerId::ANY`] when unknown or irrelevant).
    pub to: PeerId,
    /// The sender's job (its job token).
    pub job: u64,
    /// The job of the process the sender addresses.
    pub to_job: u64,
    /// The sender's fresh nonce (HELLO, CHALLENGE), else zero.
    pub nonce: [u8; NONCE_LEN],
    /// The sender's proof of the key (CHALLENGE, AUTH), else zero.
    pub mac: [u8; MAC_LEN],
    /// HELLO, CHALLENGE, AUTH: the link of the endpoint this connection is to be (0: its
    /// first; from 1 on, a connection that joins an endpoint already connected, up to
    /// [`MAX_LINKS`]` - 1`); 0 in every other record.
    pub link: u8,
}

/// Most connections (links) one endpoint has at once: its first, and those that join it.
pub const MAX_LINKS: usize = 8;

impl Hello {
    /// A record of `kind` from `pid` of our version, addressed to nobody in particular,
    /// with zero nonce and MAC; both jobs are [`DEFAULT_TOKEN`] until set.
    pub fn new(kind: HelloKind, pid: PeerId) -> Self {
        Self {
            kind,
            version: VERSION,
            pid,
            to: PeerId::ANY,
            job: DEFAULT_TOKEN,
            to_job: DEFAULT_TOKEN,
            nonce: [0; NONCE_LEN],
            mac: [0; MAC_LEN],
            link: 0,
        }
    }

    /// Checks magic and version, the first [`PREFIX_LEN`] bytes of a record (what a peer
    /// of any version can read of another's); `Ok(false)` when fewer bytes are there.
    pub fn check_prefix(buf: &[u8]) -> Result<bool, WireError> {
        let n = buf.len().min(MAGIC.len());
        if buf[..n] != MAGIC[..n] {
            return Err(WireError::BadMagic);
        }
        if buf.len() < PREFIX_LEN {
            return Ok(false);
        }
        let version = u16::from_be_bytes([buf[8], buf[9]]);
        if version != VERSION {
            return Err(WireError::BadVersion {
                got: version,
                ours: VERSION,
            });
        }
        Ok(true)
    }

    /// Parses the first [`HELLO_LEN`] bytes of `buf`. Magic and version are checked
    /// first, on as many bytes as there are ([`check_prefix`](Self::check_prefix)).
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        Self::check_prefix(&buf[..buf.len().min(PREFIX_LEN)])?;
        let b: &[u8; HELLO_LEN] = buf
            .get(..HELLO_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(WireError::Truncated)?;
        let kind = match b[10] {
            1 => HelloKind::Hello,
            2 => HelloKind::Accept,
            3 => HelloKind::Reject(RejectReason::from_code(b[11])?),
            4 => HelloKind::Probe,
            5 => HelloKind::ProbeAck,
            6 => HelloKind::Challenge,
            7 => HelloKind::Auth,
            k => return Err(WireError::BadHelloKind(k)),
        };
        let link = match kind {
            HelloKind::Hello | HelloKind::Challenge | HelloKind::Auth => b[11],
            _ => 0,
        };
        if usize::from(link) >= MAX_LINKS {
            return Err(WireError::BadLink(link));
        }
        let word = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let long = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8-byte slice"));
        Ok(Self {
            kind,
            version: VERSION,
            pid: PeerId(word(12)),
            to: PeerId(word(16)),
            job: long(20),
            to_job: long(28),
            nonce: b[36..68].try_into().expect("32-byte slice"),
            mac: b[68..100].try_into().expect("32-byte slice"),
            link,
        })
    }

    /// Writes the record into `out`.
    pub fn emit(&self, out: &mut [u8; HELLO_LEN]) {
        out[0..8].copy_from_slice(&MAGIC);
        out[8..10].copy_from_slice(&self.version.to_be_bytes());
        let (k, r) = match self.kind {
            HelloKind::Hello => (1, self.link),
            HelloKind::Accept => (2, 0),
            HelloKind::Reject(r) => (3, r.code()),
            HelloKind::Probe => (4, 0),
            HelloKind::ProbeAck => (5, 0),
            HelloKind::Challenge => (6, self.link),
            HelloKind::Auth => (7, self.link),
        };
        out[10] = k;
        out[11] = r;
        out[12..16].copy_from_slice(&self.pid.0.to_be_bytes());
        out[16..20].copy_from_slice(&self.to.0.to_be_bytes());
        out[20..28].copy_from_slice(&self.job.to_be_bytes());
        out[28..36].copy_from_slice(&self.to_job.to_be_bytes());
        out[36..68].copy_from_slice(&self.nonce);
        out[68..100].copy_from_slice(&self.mac);
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
    /// Data for a registered region of the receiver: a [`PutTarget`], then the data.
    Put,
    /// Clean close: the sender sends nothing more on this connection.
    Fin,
    /// The receiver read the next frame that carried [`FLAG_ACK`] (see the module docs).
    Ack,
    /// A count of the peer's frames this side consumed (see "Links" in the module docs).
    Confirm,
    /// The stream moves to the connection this arrives on, after this side consumed the
    /// count it carries of the peer's frames (see "Links" in the module docs).
    Resume,
    /// A read of the receiver's registered memory: a [`GetRequest`] (see "Get" in the
    /// module docs).
    Get,
    /// The answer to a GET: a [`PutTarget`] (the GET's reply target), then the data.
    Reply,
    /// The bytes that follow on this connection are a run of the stream: a
    /// [`RunFrame`] (see "Runs" in the module docs).
    Run,
    /// A piece of an active message for the header's tag, cut so that it spreads over
    /// links: a [`PartHead`], then the piece (see "Parts" in the module docs).
    Part,
}

impl FrameKind {
    const SEND: u8 = 0x01;
    const PUT: u8 = 0x02;
    const FIN: u8 = 0x04;
    const ACK: u8 = 0x08;
    const CONFIRM: u8 = 0x10;
    const RESUME: u8 = 0x20;
    const GET: u8 = 0x40;
    const REPLY: u8 = 0x80;
    const RUN: u8 = 0x30;
    const PART: u8 = 0x03;

    /// Whether frames of this kind are counted in their stream's position (every kind
    /// but the three that carry positions).
    #[inline]
    pub const fn counted(self) -> bool {
        !matches!(self, Self::Confirm | Self::Resume | Self::Run)
    }

    /// Whether frames of this kind carry a 16-byte head ([`PutTarget`], [`PartHead`]) and
    /// data placed where it says, rather than in a receive buffer (PUT, REPLY, PART).
    #[inline]
    pub const fn places(self) -> bool {
        matches!(self, Self::Put | Self::Reply | Self::Part)
    }
}

/// Payload bytes of a CONFIRM frame: a count, big-endian.
pub const COUNT_LEN: usize = 8;

/// While a standby link is open, a frame with at most this many bytes after its header is
/// kept as a copy and completes at its write; a receiver owes a prompt CONFIRM for a
/// longer frame, or a FIN (see "Links" above).
pub const KEEP_COPY_MAX: usize = 4096;

/// Payload bytes of a RESUME frame: a [`ResumeFrame`].
pub const RESUME_LEN: usize = 16;

/// Bit 0 of a RESUME's flags: its writer starts a failover and asks for an answer.
pub const RESUME_ASKS: u32 = 1;

/// What a RESUME frame says (see "Links" in the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeFrame {
    /// Frames of the reader's stream its writer consumed.
    pub count: u64,
    /// The epoch its writer starts for the stream it receives.
    pub epoch: u32,
    /// Its writer starts a failover (else it answers one).
    pub asks: bool,
}

impl ResumeFrame {
    /// The whole frame: header and payload.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN + RESUME_LEN] {
        let hdr = Header {
            kind: FrameKind::Resume,
            tag: Tag(0),
            len: RESUME_LEN as u32,
            ack: false,
            line: 0,
        };
        let flags = if self.asks { RESUME_ASKS } else { 0 };
        let mut b = [0; HEADER_LEN + RESUME_LEN];
        b[..HEADER_LEN].copy_from_slice(&hdr.to_bytes());
        b[HEADER_LEN..HEADER_LEN + 8].copy_from_slice(&self.count.to_be_bytes());
        b[HEADER_LEN + 8..HEADER_LEN + 12].copy_from_slice(&self.epoch.to_be_bytes());
        b[HEADER_LEN + 12..].copy_from_slice(&flags.to_be_bytes());
        b
    }

    /// Parses a RESUME frame's payload (the first [`RESUME_LEN`] bytes of `buf`); a flag
    /// other than [`RESUME_ASKS`] is [`WireError::BadCount`].
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = buf.get(..RESUME_LEN).ok_or(WireError::Truncated)?;
        let flags = u32::from_be_bytes(b[12..].try_into().expect("4 bytes"));
        if flags & !RESUME_ASKS != 0 {
            return Err(WireError::BadCount {
                len: RESUME_LEN as u32,
                tag: 0,
            });
        }
        Ok(Self {
            count: u64::from_be_bytes(b[..8].try_into().expect("8 bytes")),
            epoch: u32::from_be_bytes(b[8..12].try_into().expect("4 bytes")),
            asks: flags & RESUME_ASKS != 0,
        })
    }
}

/// Payload bytes of a RUN frame: a [`RunFrame`].
pub const RUN_LEN: usize = 16;

/// What a RUN frame says of the bytes that follow it on its connection (see "Runs" in the
/// module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunFrame {
    /// Where the run starts in its epoch's stream, in frames.
    pub offset: u64,
    /// The stream's epoch.
    pub epoch: u32,
    /// Frames of the stream the run carries (at least 1).
    pub len: u32,
}

impl RunFrame {
    /// The whole frame: header and payload.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN + RUN_LEN] {
        let hdr = Header {
            kind: FrameKind::Run,
            tag: Tag(0),
            len: RUN_LEN as u32,
            ack: false,
            line: 0,
        };
        let mut b = [0; HEADER_LEN + RUN_LEN];
        b[..HEADER_LEN].copy_from_slice(&hdr.to_bytes());
        b[HEADER_LEN..HEADER_LEN + 8].copy_from_slice(&self.offset.to_be_bytes());
        b[HEADER_LEN + 8..HEADER_LEN + 12].copy_from_slice(&self.epoch.to_be_bytes());
        b[HEADER_LEN + 12..].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Parses a RUN frame's payload (the first [`RUN_LEN`] bytes of `buf`); a run of no
    /// frame is [`WireError::BadRun`].
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = buf.get(..RUN_LEN).ok_or(WireError::Truncated)?;
        let r = Self {
            offset: u64::from_be_bytes(b[..8].try_into().expect("8 bytes")),
            epoch: u32::from_be_bytes(b[8..12].try_into().expect("4 bytes")),
            len: u32::from_be_bytes(b[12..].try_into().expect("4 bytes")),
        };
        if r.len == 0 {
            return Err(WireError::BadRun {
                len: RUN_LEN as u32,
                tag: 0,
            });
        }
        Ok(r)
    }
}

/// Header flag of a SEND or PUT frame: the sender lent the payload's pages to the kernel
/// and completes the send only once the receiver answers with an ACK frame.
pub const FLAG_ACK: u16 = 0x0001;

/// Header flag of a SEND without [`FLAG_ACK`]: padding bytes, as many as the bits of
/// [`FLAG_LINE_MASK`] say, come between the header and the payload (see the module docs).
pub const FLAG_PAD: u16 = 0x0002;

/// Header flag bits of a frame with [`FLAG_ACK`]: [`Header::line`], the offset of the
/// payload's first byte within a 64-byte line of the sender's memory; with [`FLAG_PAD`],
/// the number of padding bytes.
pub const FLAG_LINE_MASK: u16 = 0x3f00;

/// Bytes in the line of [`Header::line`].
pub const LINE: usize = 64;

/// [`FLAG_PAD`]'s padding is a multiple of this, so that a payload whose frame starts
/// 8-byte aligned stays so.
pub const PAD_ALIGN: usize = 8;

/// Length of a [`PutTarget`] on the wire (the first bytes of a PUT frame's payload).
pub const PUT_TARGET_LEN: usize = 16;

/// Length of a [`GetRequest`] on the wire (a GET frame's whole payload).
pub const GET_LEN: usize = 36;

/// What a GET frame asks for: `len` bytes of the receiver's region at `from`, to be
/// written at `to` in the sender's region (the target of the REPLY).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetRequest {
    /// The receiver's region and address to read from.
    pub from: PutTarget,
    /// Bytes asked for.
    pub len: u32,
    /// The sender's region and address the data goes to.
    pub to: PutTarget,
}

impl GetRequest {
    /// Encodes the request.
    pub fn to_bytes(&self) -> [u8; GET_LEN] {
        let mut b = [0; GET_LEN];
        b[..16].copy_from_slice(&self.from.to_bytes());
        b[16..20].copy_from_slice(&self.len.to_be_bytes());
        b[20..].copy_from_slice(&self.to.to_bytes());
        b
    }

    /// Parses a request from the first [`GET_LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = buf.get(..GET_LEN).ok_or(WireError::Truncated)?;
        Ok(Self {
            from: PutTarget::parse(&b[..16])?,
            len: u32::from_be_bytes(b[16..20].try_into().expect("4 bytes")),
            to: PutTarget::parse(&b[20..])?,
        })
    }
}

/// Where a PUT frame's data goes: a region the receiver registered, named by its key,
/// and an address inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutTarget {
    /// The region's key, as the receiver handed it out.
    pub key: u64,
    /// Address of the first byte written, in the receiver's address space.
    pub addr: u64,
}

impl PutTarget {
    /// Encodes the target.
    pub fn to_bytes(&self) -> [u8; PUT_TARGET_LEN] {
        let mut b = [0; PUT_TARGET_LEN];
        b[..8].copy_from_slice(&self.key.to_be_bytes());
        b[8..].copy_from_slice(&self.addr.to_be_bytes());
        b
    }

    /// Parses a target from the first [`PUT_TARGET_LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b: &[u8; PUT_TARGET_LEN] = buf
            .get(..PUT_TARGET_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(WireError::Truncated)?;
        let (k, a) = b.split_at(8);
        Ok(Self {
            key: u64::from_be_bytes(k.try_into().expect("8 bytes")),
            addr: u64::from_be_bytes(a.try_into().expect("8 bytes")),
        })
    }
}

/// A PART frame's head: which bytes of which message its piece is (see "Parts" in the
/// module docs). The same length as a [`PutTarget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartHead {
    /// The whole message's length.
    pub total: u64,
    /// Where the piece starts in the message.
    pub offset: u64,
}

impl PartHead {
    /// Encodes the head.
    pub fn to_bytes(&self) -> [u8; PUT_TARGET_LEN] {
        PutTarget {
            key: self.total,
            addr: self.offset,
        }
        .to_bytes()
    }

    /// Parses a head from the first [`PUT_TARGET_LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let t = PutTarget::parse(buf)?;
        Ok(Self {
            total: t.key,
            offset: t.addr,
        })
    }
}

/// A parsed frame header: `len` is within the maximum it was parsed against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Frame kind.
    pub kind: FrameKind,
    /// Active-message tag.
    pub tag: Tag,
    /// Length in bytes of what follows the header: the payload, and its padding if any
    /// ([`pad`](Self::pad)).
    pub len: u32,
    /// [`FLAG_ACK`]: the receiver answers with an ACK frame once it read this frame.
    pub ack: bool,
    /// With `ack`: the address of the payload's first byte in the sender's memory, modulo
    /// [`LINE`] (where to place the payload, see the module docs). Without, on a SEND: the
    /// padding bytes before the payload ([`FLAG_PAD`], a multiple of 8, within `len`;
    /// see [`pad`](Self::pad)); 0 on every other frame.
    pub line: u8,
}

impl Header {
    /// Length of the encoded header.
    pub const LEN: usize = HEADER_LEN;

    /// Parses a header, rejecting unknown kinds, unknown flags (and [`FLAG_ACK`] on a
    /// frame other than SEND or PUT, [`FLAG_PAD`] on a frame other than SEND, with
    /// [`FLAG_ACK`], or with a padding that is not a multiple of 8 from 8 up to the
    /// length), a FIN or ACK with a payload or a tag, a PUT without room for its target or
    /// with a tag, and any length above `max_len`.
    #[inline]
    pub fn parse(buf: &[u8], max_len: u32) -> Result<Self, WireError> {
        let b: &[u8; HEADER_LEN] = buf
            .get(..HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(WireError::Truncated)?;
        // The common frame first, from one load: a SEND without flags within the maximum.
        if let Some((tag, len)) = Self::plain_send(u64::from_be_bytes(*b), max_len) {
            return Ok(Self {
                kind: FrameKind::Send,
                tag,
                len,
                ack: false,
                line: 0,
            });
        }
        Self::parse_any(b, max_len)
    }

    /// The tag and length of the common frame, a SEND without flags within `max_len`,
    /// from its header read as one big-endian word `w`; `None` for every other header
    /// (which [`parse`](Self::parse) decides).
    #[inline]
    pub const fn plain_send(w: u64, max_len: u32) -> Option<(Tag, u32)> {
        if (w >> 32) & 0xff00_ffff == (FrameKind::SEND as u64) << 24 && w as u32 <= max_len {
            Some((Tag((w >> 48) as u8), w as u32))
        } else {
            None
        }
    }

    /// [`parse`](Self::parse) of every other header, and of every error.
    #[inline(never)]
    fn parse_any(b: &[u8; HEADER_LEN], max_len: u32) -> Result<Self, WireError> {
        let kind = match b[0] {
            FrameKind::SEND => FrameKind::Send,
            FrameKind::PUT => FrameKind::Put,
            FrameKind::FIN => FrameKind::Fin,
            FrameKind::ACK => FrameKind::Ack,
            FrameKind::CONFIRM => FrameKind::Confirm,
            FrameKind::RESUME => FrameKind::Resume,
            FrameKind::GET => FrameKind::Get,
            FrameKind::REPLY => FrameKind::Reply,
            FrameKind::RUN => FrameKind::Run,
            FrameKind::PART => FrameKind::Part,
            k => return Err(WireError::BadFrameKind(k)),
        };
        let flags = u16::from_be_bytes([b[2], b[3]]);
        let ack = flags & FLAG_ACK != 0;
        let line = ((flags & FLAG_LINE_MASK) >> 8) as u8;
        let len = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
        let padded = flags & FLAG_PAD != 0;
        if flags & !(FLAG_ACK | FLAG_PAD | FLAG_LINE_MASK) != 0
            || (ack
                && (padded || !matches!(kind, FrameKind::Send | FrameKind::Put | FrameKind::Reply)))
            || (padded
                && (kind != FrameKind::Send
                    || line == 0
                    || usize::from(line) % PAD_ALIGN != 0
                    || u32::from(line) > len))
            || (!ack && !padded && flags != 0)
        {
            return Err(WireError::BadFlags(flags));
        }
        if kind == FrameKind::Run {
            // A run's place, whatever the maximum frame size.
            if len as usize != RUN_LEN || b[1] != 0 || flags != 0 {
                return Err(WireError::BadRun { len, tag: b[1] });
            }
            return Ok(Self {
                kind,
                tag: Tag(0),
                len,
                ack: false,
                line: 0,
            });
        }
        if !kind.counted() {
            // A count, whatever the maximum frame size.
            let want = if kind == FrameKind::Resume {
                RESUME_LEN
            } else {
                COUNT_LEN
            };
            if len as usize != want || b[1] != 0 || flags != 0 {
                return Err(WireError::BadCount { len, tag: b[1] });
            }
            return Ok(Self {
                kind,
                tag: Tag(0),
                len,
                ack: false,
                line: 0,
            });
        }
        if len > max_len {
            return Err(WireError::FrameTooLarge { len, max: max_len });
        }
        if matches!(kind, FrameKind::Fin | FrameKind::Ack) && (len != 0 || b[1] != 0) {
            return Err(WireError::ControlWithPayload { len, tag: b[1] });
        }
        if kind.places()
            && ((len as usize) < PUT_TARGET_LEN || (b[1] != 0 && kind != FrameKind::Part))
        {
            return Err(WireError::BadPut { len, tag: b[1] });
        }
        if kind == FrameKind::Get && (len as usize != GET_LEN || b[1] != 0 || flags != 0) {
            return Err(WireError::BadGet { len, tag: b[1] });
        }
        Ok(Self {
            kind,
            tag: Tag(b[1]),
            len,
            ack,
            line,
        })
    }

    /// The padding bytes between the header and the payload ([`FLAG_PAD`]): the payload
    /// is the frame's last `len - pad()` bytes.
    #[inline]
    pub const fn pad(&self) -> usize {
        if self.ack {
            0
        } else {
            self.line as usize
        }
    }

    /// The encoded header of a SEND without flags for `tag` and `len` payload bytes: what
    /// [`to_bytes`](Self::to_bytes) gives for it, from one store.
    #[inline]
    pub const fn send_head(tag: Tag, len: u32) -> [u8; HEADER_LEN] {
        ((FrameKind::SEND as u64) << 56 | (tag.0 as u64) << 48 | len as u64).to_be_bytes()
    }

    /// Encodes the header.
    pub const fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let k = match self.kind {
            FrameKind::Send => FrameKind::SEND,
            FrameKind::Put => FrameKind::PUT,
            FrameKind::Fin => FrameKind::FIN,
            FrameKind::Ack => FrameKind::ACK,
            FrameKind::Confirm => FrameKind::CONFIRM,
            FrameKind::Resume => FrameKind::RESUME,
            FrameKind::Get => FrameKind::GET,
            FrameKind::Reply => FrameKind::REPLY,
            FrameKind::Run => FrameKind::RUN,
            FrameKind::Part => FrameKind::PART,
        };
        let line = ((self.line as u16) << 8) & FLAG_LINE_MASK;
        let f = if self.ack {
            FLAG_ACK | line
        } else if self.line != 0 {
            FLAG_PAD | line
        } else {
            0
        }
        .to_be_bytes();
        let l = self.len.to_be_bytes();
        [k, self.tag.0, f[0], f[1], l[0], l[1], l[2], l[3]]
    }
}

#[cfg(test)]
mod tests;
