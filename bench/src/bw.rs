//! `ringbtl-bench bw`: osu_bw's output, and its plain-socket baseline.
//!
//! The baseline streams the same windows over one blocking TCP socket (TCP_NODELAY)
//! between the same two processes: the sender hands the whole window to the kernel with
//! `writev` (one iovec per message, repeated while the kernel takes part of it) and
//! blocks reading the 4-byte acknowledgement; the receiver reads each message with
//! `recv(MSG_WAITALL)` and writes the acknowledgement after the last one. That is what a
//! program without a messaging library does for bulk data, and a fair floor for ringbtl's
//! gathered sends.

use std::io::{IoSlice, Read, Write};
use std::os::fd::AsRawFd;
use std::time::Instant;

use crate::stream::{
    cells, columns, common_header, retry, Metric, PairTiming, PlainStream, StreamInfo, StreamRow,
    ACK_BYTES,
};
use crate::sys;

const METRICS: [Metric; 1] = [Metric {
    osu: "Bandwidth (MB/s)",
    short: "(MB/s)",
    get: |t| t.mb_s,
}];

pub(crate) fn header(info: &StreamInfo, counts: &str) -> String {
    let mut s = common_header(info, "ringbtl Bandwidth Test (osu_bw)", counts);
    if info.baseline {
        s.push_str(
            "\n# baseline: plain TCP socket, TCP_NODELAY, blocking: one writev of the whole \
             window, recv(MSG_WAITALL) per message; same processes and cores; \
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

/// Writes every byte of `bufs` with `writev`, retrying partial writes and time-outs.
fn writev_all(
    sock: &mut std::net::TcpStream,
    mut bufs: &mut [IoSlice<'_>],
    deadline: Instant,
) -> Result<(), String> {
    while !bufs.is_empty() {
        match sock.write_vectored(bufs) {
            Ok(0) => return Err("baseline writev: the peer closed the connection".into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) => retry(e, "writev", deadline)?,
        }
    }
    Ok(())
}

fn read_all(
    sock: &mut std::net::TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<(), String> {
    let mut got = 0;
    while got < buf.len() {
        match sock.read(&mut buf[got..]) {
            Ok(0) => return Err("baseline read: the peer closed the connection".into()),
            Ok(n) => got += n,
            Err(e) => retry(e, "read", deadline)?,
        }
    }
    Ok(())
}

/// Sender: `warmup + loops` windows; a 0-byte size moves 1 byte (TCP has no empty message).
pub(crate) fn plain_send(
    p: &mut PlainStream,
    size: usize,
    window: u64,
    warmup: u64,
    loops: u64,
    deadline: Instant,
) -> Result<PairTiming, String> {
    let n = size.max(1);
    let (sock, buf) = p.prepare(n, false)?;
    let whole: Vec<IoSlice<'_>> = (0..window).map(|_| IoSlice::new(&buf[..n])).collect();
    let mut work = whole.clone();
    let mut ack = [0u8; ACK_BYTES];
    PairTiming::run_windows(window, size, warmup, loops, |_| {
        work.copy_from_slice(&whole);
        writev_all(sock, &mut work, deadline)?;
        read_all(sock, &mut ack, deadline)
    })
}

/// Receiver: `loops` windows, each message read whole, then the acknowledgement.
pub(crate) fn plain_recv(
    p: &mut PlainStream,
    size: usize,
    window: u64,
    loops: u64,
    deadline: Instant,
) -> Result<(), String> {
    let n = size.max(1);
    let (sock, buf) = p.prepare(n, false)?;
    let fd = sock.as_raw_fd();
    let ack = [0x41u8; ACK_BYTES];
    for _ in 0..loops {
        for _ in 0..window {
            let mut got = 0;
            while got < n {
                match sys::recv(fd, &mut buf[got..n], libc::MSG_WAITALL) {
                    Ok(0) => return Err("baseline recv: the peer closed the connection".into()),
                    Ok(k) => got += k,
                    Err(e) => retry(e, "recv", deadline)?,
                }
            }
        }
        let mut bufs = [IoSlice::new(&ack)];
        writev_all(sock, &mut bufs, deadline)?;
    }
    Ok(())
}
