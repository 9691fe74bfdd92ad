//! Errors: the public [`Error`], protocol violations ([`ProtoError`]), and the codec's
//! [`WireError`] (defined with the codec in [`wire`](crate::wire), re-exported here).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

pub use crate::wire::WireError;
use crate::wire::{PeerId, RejectReason, Tag};

/// A peer broke the protocol; the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    /// Malformed record or header.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The peer speaks another protocol version.
    #[error("unsupported protocol version {got:#06x} (we speak {ours:#06x})")]
    UnsupportedVersion {
        /// Peer's version.
        got: u16,
        /// Ours.
        ours: u16,
    },
    /// The peer could not prove that it holds the job key (or its job token differs
    /// from ours): its MAC did not verify.
    #[error("authentication failed: the peer does not hold this job's key (or token)")]
    AuthFailed,
    /// The answering process is not the one we dialed.
    #[error("dialed {expected} but {got} answered")]
    WrongPeer {
        /// Who we dialed.
        expected: PeerId,
        /// Who answered.
        got: PeerId,
    },
    /// A handshake record arrived where it makes no sense.
    #[error("unexpected handshake record in state {state}")]
    UnexpectedHello {
        /// State name.
        state: &'static str,
    },
    /// The peer refused the connection.
    #[error("connection refused by peer: {0:?}")]
    Rejected(RejectReason),
    /// The handshake did not finish in time.
    #[error("handshake timed out")]
    HandshakeTimeout,
    /// Bytes arrived after the peer's FIN, which promised that nothing more follows.
    #[error("data after FIN")]
    DataAfterFin,
    /// An ACK frame arrived while no frame of ours waited for one.
    #[error("ACK frame with no frame waiting for it")]
    UnexpectedAck,
    /// An accepted connection sent nothing within the first-bytes deadline
    /// (`RINGBTL_FIRST_BYTES_MS`).
    #[error("no byte within the first-bytes deadline")]
    FirstBytesTimeout,
    /// An accepted connection still in its handshake was closed to admit a newcomer
    /// (the oldest of its source or of all; `RINGBTL_MAX_HALF_OPEN`,
    /// `RINGBTL_MAX_HALF_OPEN_PER_SOURCE`).
    #[error("closed to admit a newer connection (too many handshakes pending)")]
    Evicted,
    /// Bytes arrived on a link beyond an endpoint's first, which carries no frame: that
    /// link is closed (the endpoint stays connected).
    #[error("bytes on a link that carries no frame")]
    FrameOnLink,
    /// A CONFIRM or RESUME counted more of our frames than were sent.
    #[error("a count beyond the frames sent")]
    CountBeyondSent,
    /// A RESUME arrived where no failover can take it: an answer on the primary to no
    /// RESUME of ours, or one on another link than the one this side resumed on.
    #[error("RESUME where no failover can take it")]
    UnexpectedResume,
    /// A RUN frame no honest sender writes: inside a run, of an epoch newer than the
    /// receiver's, starting before the stream's position or overlapping another link's
    /// run.
    #[error("RUN frame out of the stream's order")]
    RunOutOfOrder,
    /// A REPLY arrived that answers none of our GETs, or not as that GET asked.
    #[error("REPLY that answers no GET of ours")]
    UnexpectedReply,
    /// A GET named memory outside our readable regions.
    #[error("GET outside the readable regions: {0}")]
    GetOutsideRegions(crate::buf::RegionError),
    /// The peer's GETs asked for replies while four times `RINGBTL_MAX_QUEUED_BYTES` and
    /// the maximum frame waited for it, more than its own limit lets an honest peer ask.
    #[error("GETs asking for more replies at once than RINGBTL_MAX_QUEUED_BYTES allows")]
    TooManyGets,
}

/// Why sending is impossible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The endpoint failed earlier; nothing can reach that peer.
    #[error("{0} is unreachable")]
    Unreachable(PeerId),
    /// No such peer was added.
    #[error("unknown {0}")]
    UnknownPeer(PeerId),
    /// More payload segments than a message may have.
    #[error("{got} segments, at most {max} allowed")]
    TooManySegments {
        /// Given.
        got: usize,
        /// Allowed.
        max: usize,
    },
    /// The message is larger than the maximum frame size.
    #[error("message of {len} bytes exceeds the maximum frame size {max}")]
    TooLarge {
        /// Message length.
        len: usize,
        /// Maximum.
        max: usize,
    },
    /// The transport is shutting down.
    #[error("transport is shutting down")]
    ShuttingDown,
    /// A get's destination does not lie inside a region of ours.
    #[error("get destination: {0}")]
    Region(#[from] crate::buf::RegionError),
    /// More than `RINGBTL_MAX_QUEUED_BYTES` would wait for this peer (it reads slower
    /// than we send, or not at all). The send was **not** accepted and no completion will
    /// come for it: make progress, then send it again.
    #[error("send queue of {0} is full (RINGBTL_MAX_QUEUED_BYTES): progress, then retry")]
    WouldBlock(PeerId),
}

/// An OS error code (`errno`), kept as a number from the socket call that failed to the
/// application's error, so that a caller can match on it (`ECONNREFUSED`, `ETIMEDOUT`...).
/// Displayed as the OS describes it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// Connection refused.
    pub const ECONNREFUSED: Self = Self(libc::ECONNREFUSED);
    /// Connection reset by peer.
    pub const ECONNRESET: Self = Self(libc::ECONNRESET);
    /// Connection timed out.
    pub const ETIMEDOUT: Self = Self(libc::ETIMEDOUT);
    /// Operation cancelled (a pending operation of a closed socket).
    pub const ECANCELED: Self = Self(libc::ECANCELED);
    /// Broken pipe.
    pub const EPIPE: Self = Self(libc::EPIPE);
    /// Connection aborted.
    pub const ECONNABORTED: Self = Self(libc::ECONNABORTED);
    /// Input/output error: stands for an `io::Error` that carries no OS code.
    pub const EIO: Self = Self(libc::EIO);

    /// The code of `e` ([`EIO`](Self::EIO) when it has none).
    pub fn of(e: &io::Error) -> Self {
        Self(e.raw_os_error().unwrap_or(libc::EIO))
    }

    /// The raw code.
    pub fn raw(self) -> i32 {
        self.0
    }

    /// The portable kind of this error (`ConnectionRefused`, `TimedOut`...).
    pub fn kind(self) -> io::ErrorKind {
        io::Error::from(self).kind()
    }
}

impl From<Errno> for io::Error {
    fn from(e: Errno) -> Self {
        io::Error::from_raw_os_error(e.0)
    }
}

impl From<&io::Error> for Errno {
    fn from(e: &io::Error) -> Self {
        Self::of(e)
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        io::Error::from(*self).fmt(f)
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Errno({}: {})", self.0, self)
    }
}

/// Why a connection attempt or an open connection ended without a protocol violation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Cause {
    /// A socket operation failed with this OS error.
    #[error("{0}")]
    Os(Errno),
    /// Writing failed with this OS error.
    #[error("send failed: {0}")]
    SendFailed(Errno),
    /// No address is known for the peer.
    #[error("no address known for this peer")]
    NoAddress,
    /// The peer closed its end without sending FIN first.
    #[error("peer closed without FIN")]
    ClosedWithoutFin,
    /// The acceptor closed our connection before answering the handshake.
    #[error("closed during handshake")]
    ClosedInHandshake,
    /// The handshake did not finish in time.
    #[error("handshake timed out")]
    HandshakeTimeout,
    /// We lost a simultaneous connect, and the peer's own dial never arrived.
    #[error("peer's dial did not arrive")]
    PeerDialMissing,
    /// The peer refused the connection with this reason.
    #[error("refused by peer: {0:?}")]
    Refused(RejectReason),
    /// A frame in progress saw no byte for this long (`RINGBTL_FRAME_STALL_MS`).
    #[error("a frame in progress received no byte for {0:?} (RINGBTL_FRAME_STALL_MS)")]
    FrameStalled(Duration),
    /// Frames whose pages were lent waited this long for the peer's ACK
    /// (`RINGBTL_FRAME_STALL_MS`).
    #[error("lent frames got no ACK for {0:?} (RINGBTL_FRAME_STALL_MS)")]
    AckStalled(Duration),
    /// The operating system gave no random numbers for a handshake nonce.
    #[error("no random numbers for a handshake nonce")]
    NoNonce,
    /// The primary connection failed with frames the peer had not consumed that were
    /// written, and completed, before a standby link opened: they cannot go again.
    #[error("the connection failed with frames sent before a standby link opened")]
    LostBeforeLinks,
}

impl Cause {
    /// The OS error code behind this cause, if the OS reported one.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Self::Os(e) | Self::SendFailed(e) => Some(*e),
            _ => None,
        }
    }
}

impl From<Errno> for Cause {
    fn from(e: Errno) -> Self {
        Self::Os(e)
    }
}

/// The reason a send completed with an error, or an endpoint failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FailReason {
    /// Connecting failed after every retry.
    #[error("connect to {peer} failed after {attempts} attempts: {cause}")]
    ConnectFailed {
        /// The peer.
        peer: PeerId,
        /// Attempts made.
        attempts: u32,
        /// Why the last attempt failed (with the OS error code when the OS reported one).
        cause: Cause,
    },
    /// The connection broke (reset, EOF without FIN, I/O error).
    #[error("connection to {peer} lost: {cause}")]
    ConnectionLost {
        /// The peer.
        peer: PeerId,
        /// Why (with the OS error code when the OS reported one).
        cause: Cause,
    },
    /// The peer broke the protocol.
    #[error("{peer} broke the protocol: {err}")]
    Protocol {
        /// The peer.
        peer: PeerId,
        /// What it did.
        err: ProtoError,
    },
    /// The peer closed cleanly (FIN) while sends were pending.
    #[error("{0} closed the connection")]
    PeerClosed(PeerId),
    /// Our own shutdown ended the send.
    #[error("transport shut down")]
    Shutdown,
    /// The endpoint had failed before.
    #[error("{0} is unreachable")]
    Unreachable(PeerId),
}

/// Public error type.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A system call failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Sending was refused.
    #[error(transparent)]
    Send(#[from] SendError),
    /// No compiled-in backend can run here.
    #[error("no usable backend: {0}")]
    NoBackend(String),
    /// Bad configuration (names the variable or field and the accepted values).
    #[error("configuration: {0}")]
    Config(String),
    /// An active-message tag is already registered.
    #[error("tag {0:?} already has a handler")]
    TagInUse(Tag),
    /// Address exchange or interface selection failed.
    #[error("wire-up: {0}")]
    Wireup(String),
    /// Called from inside a callback where it is not allowed.
    #[error("{0} may not be called from inside a callback")]
    Reentrant(&'static str),
    /// A wait ran out of time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// [`wireup::probe`](crate::wireup::probe) found no ringbtl process.
    #[error(transparent)]
    Probe(#[from] ProbeError),
}

/// Why [`wireup::probe`](crate::wireup::probe) found no ringbtl process at an address.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// The connection was refused: nothing listens there.
    #[error("probe {0}: nothing listens there (connection refused)")]
    NothingListens(SocketAddr),
    /// Something listens but did not answer as ringbtl does.
    #[error("probe {addr}: not a ringbtl process ({why})")]
    NotRingbtl {
        /// The address probed.
        addr: SocketAddr,
        /// What it did instead (bad magic, closed the connection...).
        why: String,
    },
    /// No connection or no answer within the time allowed.
    #[error("probe {addr}: no answer within {timeout:?}")]
    Timeout {
        /// The address probed.
        addr: SocketAddr,
        /// The time allowed.
        timeout: Duration,
    },
    /// Another socket error.
    #[error("probe {addr}: {source}")]
    Io {
        /// The address probed.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    pub(crate) fn io(op: &'static str, source: io::Error) -> Self {
        Self::Io { op, source }
    }
}
