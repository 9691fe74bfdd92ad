//! Errors: the public [`Error`], protocol violations ([`ProtoError`]) and codec errors
//! ([`WireError`]).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::wire::{PeerId, RejectReason, Tag};

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
    /// The job token differs from ours.
    #[error("job token mismatch")]
    BadToken,
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
}

/// The reason a send completed with an error, or an endpoint failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FailReason {
    /// Connecting failed after every retry.
    #[error("connect to {peer} failed after {attempts} attempts: {errno}")]
    ConnectFailed {
        /// The peer.
        peer: PeerId,
        /// Attempts made.
        attempts: u32,
        /// Last error text.
        errno: String,
    },
    /// The connection broke (reset, EOF without FIN, I/O error).
    #[error("connection to {peer} lost: {why}")]
    ConnectionLost {
        /// The peer.
        peer: PeerId,
        /// Cause.
        why: String,
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
    /// [`Transport::probe`](crate::Transport::probe) found no ringbtl process.
    #[error(transparent)]
    Probe(#[from] ProbeError),
}

/// Why [`Transport::probe`](crate::Transport::probe) found no ringbtl process at an address.
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
