//! The sans-IO protocol core: no file descriptors, no syscalls, no clocks.
//!
//! Time is passed in; bytes come in through [`RxBuf`](crate::buf::RxBuf)s (read by the
//! reactor, or lent from its provided buffers) and go out through
//! [`TxBatch`](crate::buf::TxBatch)es, both carried by the engine's actions. The call
//! contract is in [`core`].
//!
//! | file | owns |
//! | --- | --- |
//! | [`core`] | the engine's face: `Core`, its actions and events, polling, timers, shutdown |
//! | `endpoint` | the endpoint state machine: connect, retries, handshake decisions, FIN, failure |
//! | `handshake` | the challenge-response: HELLO, CHALLENGE, AUTH, nonces, MAC checks |
//! | `jobs` | peers of other jobs: their pair keys, the local ids their processes go by |
//! | `failover` | confirmations, kept frames, RESUME: a failed primary loses nothing |
//! | `get` | one-sided reads: GET requests, REPLYs from readable regions, their bounds |
//! | `links` | an endpoint's connections beyond its first: plan, dials, joins, loss |
//! | `conn` | the connection table: per-socket stage, deadline, buffers, accept and close |
//! | `spread` | a stream over several links: runs placed by the sender, taken in order by the receiver |
//! | [`part`] | messages cut into PART frames: the one an endpoint assembles, where each piece goes |
//! | `recv` | the receive side: one walk for both receive modes, large-payload decisions |
//! | [`deframe`] | the deframer: records and frames out of a byte stream cut anywhere |
//! | `tx` | batching: queued frames into one gathered send per connection, completions |
//! | [`am`] | the active-message table: tag -> handler |
//! | [`config`] | the engine's settings |

pub mod am;
pub mod config;
mod conn;
pub mod core;
pub mod deframe;
mod endpoint;
mod failover;
mod get;
mod handshake;
mod jobs;
mod links;
pub mod part;
mod recv;
mod spread;
mod tx;

#[cfg(test)]
mod tests;
