//! Placeholder until the epoll backend lands.
#![allow(dead_code, unused_variables, missing_docs)]
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use super::{Backend, ConnId, Event, RxBuf, SockOpts, TxBatch};

pub(crate) struct Epoll;

impl Epoll {
    pub(crate) fn new(opts: SockOpts) -> io::Result<Self> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

impl Backend for Epoll {
    fn name(&self) -> &'static str {
        "epoll"
    }
    fn listen(&mut self, addr: SocketAddr) -> io::Result<SocketAddr> {
        unimplemented!()
    }
    fn connect(&mut self, addr: SocketAddr, bind: Option<SocketAddr>) -> io::Result<ConnId> {
        unimplemented!()
    }
    fn send(&mut self, conn: ConnId, batch: TxBatch) {
        unimplemented!()
    }
    fn recv(&mut self, conn: ConnId, rx: RxBuf) {
        unimplemented!()
    }
    fn close(&mut self, conn: ConnId) {
        unimplemented!()
    }
    fn poll(&mut self, timeout: Option<Duration>, out: &mut Vec<Event>) -> io::Result<()> {
        unimplemented!()
    }
}
