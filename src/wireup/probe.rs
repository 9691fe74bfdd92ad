//! Probing an address: is a ringbtl process listening there? A blocking connect, a
//! `PROBE` handshake record and its answer, before (or without) any transport.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::error::{Error, ProbeError};
use crate::wire::{Hello, HelloKind, PeerId, HELLO_LEN};

/// Asks whatever listens at `addr` whether it is a ringbtl process, without creating
/// an endpoint: a blocking connect, a `PROBE` handshake record, and the `PROBE_ACK`
/// answer, which says only "alive" and the listener's process id (nothing secret: no
/// nonce, no MAC, no token). Our own process id is not known here, so the record
/// carries [`PeerId::ANY`]. The listener closes the connection.
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
    let rec = Hello::new(HelloKind::Probe, PeerId::ANY);
    s.write_all(&rec.to_bytes()).map_err(io_err)?;
    s.set_read_timeout(Some(left())).map_err(io_err)?;
    // Read the whole answer, or until the other side closes: a short answer that is not
    // ours still says what it is (bad magic).
    let mut buf = [0u8; HELLO_LEN];
    let mut got = 0;
    while got < HELLO_LEN {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Err(io_err(io::ErrorKind::UnexpectedEof.into())),
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(e)),
        }
    }
    match Hello::parse(&buf[..got]) {
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
