//! The public face: [`Transport`] = reactor + endpoints + active-message table.
#![allow(missing_docs, unused_variables, dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;

use crate::config::Config;
use crate::error::{Error, FailReason, SendError};
use crate::wire::{PeerId, Tag};

/// A received active message, valid during the handler call.
#[derive(Debug)]
pub struct Am<'a> {
    pub src: PeerId,
    pub tag: Tag,
    pub payload: &'a [u8],
}

/// A finished send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub peer: PeerId,
    pub cookie: u64,
    pub result: Result<(), FailReason>,
}

pub struct Transport {}

impl Transport {
    pub fn new(cfg: Config) -> Result<Self, Error> {
        unimplemented!()
    }
    pub fn local_addr(&self) -> SocketAddr {
        unimplemented!()
    }
    pub fn local_id(&self) -> PeerId {
        unimplemented!()
    }
    pub fn backend_name(&self) -> &'static str {
        unimplemented!()
    }
    pub fn add_peer(&mut self, id: PeerId, addrs: Vec<SocketAddr>) -> Result<(), Error> {
        unimplemented!()
    }
    pub fn register<F>(&mut self, tag: Tag, f: F) -> Result<(), Error>
    where
        F: FnMut(&mut Transport, &Am<'_>) + 'static,
    {
        unimplemented!()
    }
    pub fn on_complete<F: FnMut(Completion) + 'static>(&mut self, f: F) {
        unimplemented!()
    }
    pub fn on_error<F: FnMut(PeerId, &FailReason) + 'static>(&mut self, f: F) {
        unimplemented!()
    }
    pub fn send(
        &mut self,
        peer: PeerId,
        tag: Tag,
        segs: &[Bytes],
        cookie: u64,
    ) -> Result<(), SendError> {
        unimplemented!()
    }
    pub fn progress(&mut self) -> Result<usize, Error> {
        unimplemented!()
    }
    pub fn wait(&mut self, timeout: Duration) -> Result<usize, Error> {
        unimplemented!()
    }
    pub fn shutdown(&mut self, timeout: Duration) -> Result<(), Error> {
        unimplemented!()
    }
}
