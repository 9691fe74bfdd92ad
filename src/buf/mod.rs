//! The byte containers that cross between the protocol core and the reactor, and nothing
//! else: they hold bytes and positions, and know no frame, header or connection. The
//! protocol reads frames out of them ([`proto::deframe`](crate::proto::deframe)) and
//! fills them (its batching); the reactor hands them to the kernel.
//! No I/O here.
//!
//! Ownership follows the "rent" model: a [`TxBatch`] or an [`RxBuf`] is *moved* to the
//! reactor for one operation and comes back with its completion, so whatever the kernel
//! may touch is owned by the reactor's operation table meanwhile.
//!
//! | file | owns |
//! |---|---|
//! | `rx.rs` | [`RxBuf`]: receive cache and whole-record buffers, their place in the line |
//! | `tx.rs` | [`TxBatch`]: the pieces of one gathered send |
//! | `regions.rs` | [`Regions`], [`Claim`]: registered memory that peers may put into or get from |

mod regions;
mod rx;
mod tx;

pub use regions::{Access, Claim, OwnedMem, RegionError, Regions};
pub use rx::{RxBuf, LINE, RECORD_ALIGN, WHOLE_FIRST};
pub use tx::{TxBatch, DIRECT_PIECES};
