//! The few system calls the benchmark makes directly: CPU pinning, dying with the parent,
//! and `send`/`recv` with explicit flags for the plain-socket baseline.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

/// Pins the calling thread (and the threads it creates afterwards) to `cpu`.
pub(crate) fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {cpu} is beyond CPU_SETSIZE"),
        ));
    }
    // SAFETY: `cpu_set_t` is a plain bit array; all-zero bytes are a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu < CPU_SETSIZE` was checked above, so the bit lies inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 means the calling thread; `set` is a valid, initialised `cpu_set_t`
    // and the size passed is exactly its size. The kernel only reads it during the call.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Asks the kernel to SIGKILL this process when its parent dies.
pub(crate) fn die_with_parent() -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes one integer argument (the signal) and touches no
    // memory of ours; the remaining arguments are ignored and passed as 0.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `send(2)` of `buf` on `fd` with `flags`.
pub(crate) fn send(fd: RawFd, buf: &[u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: `buf` is a live, readable slice of `buf.len()` bytes for the whole call and
    // the kernel keeps no reference to it afterwards. A bad `fd` is an error, not UB.
    let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), flags) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `recv(2)` into `buf` on `fd` with `flags`.
pub(crate) fn recv(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: `buf` is a live, writable, exclusively borrowed slice of `buf.len()` bytes
    // for the whole call; the kernel writes at most that many bytes and keeps no reference.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Waits in `poll(2)` until `fd` is readable (`read`) or writable (`write`), an error or
/// hang-up is pending, or `timeout` has passed; EINTR counts as a return.
pub(crate) fn wait_fd(
    fd: RawFd,
    read: bool,
    write: bool,
    timeout: std::time::Duration,
) -> io::Result<()> {
    let mut events = 0;
    if read {
        events |= libc::POLLIN;
    }
    if write {
        events |= libc::POLLOUT;
    }
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `p` is one live, writable `pollfd` for the whole call and the count passed
    // is 1; the kernel writes only its `revents` and keeps no reference afterwards.
    let rc = unsafe { libc::poll(&raw mut p, 1, ms) };
    if rc >= 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::Interrupted {
        Ok(())
    } else {
        Err(e)
    }
}

/// Sets SO_RCVLOWAT: a blocked reader is woken once `bytes` are queued, not before.
pub(crate) fn set_rcvlowat(fd: RawFd, bytes: usize) -> io::Result<()> {
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: `v` is a live c_int and the length passed is exactly its size; the kernel
    // copies it during the call.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&raw const v).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Gives a baseline socket the congestion control that a ringbtl connection to the same
/// peer gets (`RINGBTL_TCP_CONGESTION`, by default `reno` towards loopback), so that a
/// baseline differs from ringbtl in the transport only.
pub(crate) fn congestion_like_ringbtl(sock: &std::net::TcpStream) -> Result<(), String> {
    let cfg = crate::cli::env_config()?;
    let peer = sock
        .peer_addr()
        .map_err(|e| format!("baseline socket: peer address: {e}"))?;
    if let Some(name) = cfg.socket.tcp_congestion.for_peer(&peer) {
        socket2::SockRef::from(sock)
            .set_tcp_congestion(name.as_bytes())
            .map_err(|e| format!("baseline socket: TCP_CONGESTION {name}: {e}"))?;
    }
    Ok(())
}
