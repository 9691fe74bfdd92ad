//! ringbtl: a TCP byte-transfer layer for HPC message passing, built on io_uring.
#![deny(unsafe_code)]

pub mod config;
pub mod error;
pub mod proto;
pub(crate) mod reactor;
pub mod transport;
pub mod wire;

pub use config::{Config, ProgressMode};
pub use error::{Error, FailReason, ProtoError, SendError, WireError};
pub use reactor::BackendKind;
pub use transport::{Am, Completion, Transport};
pub use wire::{PeerId, Tag};

#[cfg(not(any(feature = "uring", feature = "epoll")))]
compile_error!("ringbtl needs a backend: enable the `uring` and/or `epoll` cargo feature");
