//! `ringbtl-bench rate`: osu_mbw_mr's output, and its plain-socket baseline.
//!
//! The baseline is what a program without a messaging library does for a flood of small
//! messages: one non-blocking TCP socket (TCP_NODELAY), one `send` per message, spun on
//! EAGAIN; the receiver drains the socket with non-blocking `recv` calls of up to
//! 256 KiB (many messages per call) and answers each window with a 4-byte
//! acknowledgement. Coalescing several messages into one send is exactly what a library
//! adds, so it is left out of the baseline on purpose.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use crate::stream::{
    cells, columns, common_header, Metric, PairTiming, PlainStream, StreamInfo, StreamRow,
    ACK_BYTES,
};

const METRICS: [Metric; 2] = [
    Metric {
        osu: "MB/s",
        short: "MB/s",
        get: |t| t.mb_s,
    },
    Metric {
        osu: "Messages/s",
        short: "msg/s",
        get: |t| t.msg_s,
    },
];
/// Receive buffer of the baseline's receiver.
const DRAIN: usize = 256 * 1024;
/// Failed non-blocking calls between two deadline checks.
const SPINS_PER_CLOCK: u32 = 4096;

pub(crate) fn header(info: &StreamInfo, counts: &str) -> String {
    let mut s = common_header(
        info,
        "ringbtl Multiple Bandwidth / Message Rate Test (osu_mbw_mr)",
        counts,
    );
    if info.baseline {
        s.push_str(
            "\n# baseline: plain TCP socket, TCP_NODELAY, non-blocking and spun: one send per \
             message, receiver drains with recv of up to 256 KiB; same processes and cores; \
             ratio = ringbtl / baseline",
        );
    }
    s.push('\n');
    s.push_str(&columns(info, &METRICS));
    s
}

pub(crate) fn row(info: &StreamInfo, row: &StreamRow) -> String {
    cells(info, row, &METRICS)
}

/// EAGAIN and EINTR spin; the deadline is checked every [`SPINS_PER_CLOCK`] of them.
fn spin(e: std::io::Error, op: &str, spins: &mut u32, deadline: Instant) -> Result<(), String> {
    use std::io::ErrorKind::{Interrupted, WouldBlock};
    match e.kind() {
        WouldBlock | Interrupted => {
            *spins = spins.wrapping_add(1);
            if spins.is_multiple_of(SPINS_PER_CLOCK) && Instant::now() >= deadline {
                return Err(format!("baseline {op} timed out"));
            }
            Ok(())
        }
        _ => Err(format!("baseline {op}: {e}")),
    }
}

fn send_all(sock: &mut TcpStream, mut buf: &[u8], deadline: Instant) -> Result<(), String> {
    let mut spins = 0;
    while !buf.is_empty() {
        match sock.write(buf) {
            Ok(0) => return Err("baseline send: the peer closed the connection".into()),
            Ok(n) => buf = &buf[n..],
            Err(e) => spin(e, "send", &mut spins, deadline)?,
        }
    }
    Ok(())
}

/// Receives exactly `want` bytes into `buf` (reused; only the count matters).
fn drain(
    sock: &mut TcpStream,
    buf: &mut [u8],
    want: usize,
    deadline: Instant,
) -> Result<(), String> {
    let mut spins = 0;
    let mut got = 0;
    while got < want {
        let k = (want - got).min(buf.len());
        match sock.read(&mut buf[..k]) {
            Ok(0) => return Err("baseline recv: the peer closed the connection".into()),
            Ok(n) => got += n,
            Err(e) => spin(e, "recv", &mut spins, deadline)?,
        }
    }
    Ok(())
}

/// Sender: `warmup + loops` windows, one `send` per message; a 0-byte size moves 1 byte.
pub(crate) fn plain_send(
    p: &mut PlainStream,
    size: usize,
    window: u64,
    warmup: u64,
    loops: u64,
    deadline: Instant,
) -> Result<PairTiming, String> {
    let n = size.max(1);
    let (sock, buf) = p.prepare(n, true)?;
    let mut ack = [0u8; ACK_BYTES];
    PairTiming::run_windows(window, size, warmup, loops, |_| {
        for _ in 0..window {
            send_all(sock, &buf[..n], deadline)?;
        }
        drain(sock, &mut ack, ACK_BYTES, deadline)
    })
}

/// Receiver: drains `loops` windows, acknowledging each.
pub(crate) fn plain_recv(
    p: &mut PlainStream,
    size: usize,
    window: u64,
    loops: u64,
    deadline: Instant,
) -> Result<(), String> {
    let want = size.max(1) * window as usize;
    let (sock, buf) = p.prepare(DRAIN, true)?;
    let ack = [0x41u8; ACK_BYTES];
    for _ in 0..loops {
        drain(sock, buf, want, deadline)?;
        send_all(sock, &ack, deadline)?;
    }
    Ok(())
}
