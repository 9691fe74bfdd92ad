//! Probing an address: is a ringbtl process listening there? A blocking connect, a
//! `PROBE` handshake record and its answer, before (or without) any transport.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::error::{Error, ProbeError};
use crate::wire::{Hello, HelloKind, PeerId, DEFAULT_TOKEN, HELLO_LEN, VERSION};

/// Asks whatever listens at `addr` whether it is a ringbtl process, without creating
/// an endpoint: a blocking connect, a `PROBE` handshake record, and the 24-byte
/// `PROBE_ACK` answer, which carries the listener's process id. Our own process id is
/// not known here, so the record carries `u32::MAX`. The listener counts the probe and
/// closes the connection.
///
/// Errors ([`Error::Probe`]): nothing listens there, something that is not ringbtl
/// answered (bad magic, or closed the connection), no answer within `timeout`.
pub fn probe(addr: SocketAddr, timeout: Duration) -> Result<PeerId, Error> {
    let timeout = timeout.max(Duration::from_millis(1));
    let deadline = Instant::now() + timeout;
    let io_err = |source: io::Error| -> Error {
        match source.kind() {
            io::ErrorKind::ConnectionRefused => ProbeError::NothingListens(addr),
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
                ProbeError::Timeout { addr, timeout }
            }
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => {
                ProbeError::NotRingbtl {
                    addr,
                    why: "closed the connection without answering".into(),
                }
            }
            _ => ProbeError::Io { addr, source },
        }
        .into()
    };
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(io_err)?;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    s.set_nodelay(true).map_err(io_err)?;
    s.set_write_timeout(Some(left())).map_err(io_err)?;
    let rec = Hello {
        kind: HelloKind::Probe,
        version: VERSION,
        pid: PeerId(u32::MAX),
        token: DEFAULT_TOKEN,
    };
    s.write_all(&rec.to_bytes()).map_err(io_err)?;
    s.set_read_timeout(Some(left())).map_err(io_err)?;
    let mut buf = [0u8; HELLO_LEN];
    s.read_exact(&mut buf).map_err(io_err)?;
    match Hello::parse(&buf) {
        Ok(h) if h.kind == HelloKind::ProbeAck => Ok(h.pid),
        Ok(h) => Err(ProbeError::NotRingbtl {
            addr,
            why: format!("answered a probe with {:?}", h.kind),
        }
        .into()),
        Err(e) => Err(ProbeError::NotRingbtl {
            addr,
            why: e.to_string(),
        }
        .into()),
    }
}
