//! The protocol core's settings: what the engine needs to know, validated by the core.
//! No I/O here.

use std::time::Duration;

use crate::wire::PeerId;

/// Engine parameters (a subset of [`Config`](crate::Config)).
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Our process id.
    pub pid: PeerId,
    /// Job token.
    pub token: u64,
    /// Receive cache bytes per connection.
    pub recv_cache: usize,
    /// Largest payload accepted.
    pub max_frame: u32,
    /// Payloads up to this size are copied next to their header.
    pub inline_limit: usize,
    /// Byte budget of one gathered send.
    pub coalesce_bytes: usize,
    /// Most iovecs in one gathered send.
    pub max_iov: usize,
    /// Connect attempts before failing.
    pub connect_retries: u32,
    /// First retry delay (doubles).
    pub retry_delay: Duration,
    /// Handshake time limit.
    pub handshake_timeout: Duration,
    /// Most incoming connections waiting for their HELLO at once; more are closed at
    /// once (a connection flood costs no buffer).
    pub max_half_open: usize,
    /// Receives run as one multishot receive per connection on buffers the driver
    /// provides ([`Action::ArmProvided`](crate::proto::core::Action::ArmProvided)),
    /// instead of one [`Action::Receive`](crate::proto::core::Action::Receive) per read.
    pub multishot: bool,
}
