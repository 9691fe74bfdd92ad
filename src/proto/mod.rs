//! The sans-IO protocol core: no file descriptors, no syscalls, no clocks.
//!
//! Time is passed in; bytes come in through [`recv_cache::RxBuf`] and go out through
//! [`tx::TxBatch`].

pub mod am;
pub mod config;
pub mod core;
pub mod recv_cache;
pub mod tx;

#[cfg(test)]
mod input_tests;
#[cfg(test)]
mod tests;
