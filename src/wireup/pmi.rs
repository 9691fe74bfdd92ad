//! A PMI-1 client in pure Rust: the text protocol MPICH's `mpiexec.hydra` and Flux serve
//! on the socket named by `PMI_FD`.
//!
//! Each request and each response is one line of space-separated `key=value` pairs,
//! starting with `cmd=`:
//!
//! | request | response |
//! |---|---|
//! | `cmd=init pmi_version=1 pmi_subversion=1` | `cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1` |
//! | `cmd=get_maxes` | `cmd=maxes rc=0 kvsname_max=K keylen_max=L vallen_max=V` |
//! | `cmd=get_my_kvsname` | `cmd=my_kvsname rc=0 kvsname=NAME` |
//! | `cmd=put kvsname=NAME key=K value=V` | `cmd=put_result rc=0` |
//! | `cmd=barrier_in` | `cmd=barrier_out` (once every rank entered) |
//! | `cmd=get kvsname=NAME key=K` | `cmd=get_result rc=0 value=V` |
//! | `cmd=finalize` | `cmd=finalize_ack` |
//!
//! Servers differ in field order and some omit `rc`, so responses are parsed as a set of
//! pairs and a missing `rc` means success. Keys and values may not contain spaces, `=`
//! in keys, or control characters, since the protocol has no quoting. A value longer than
//! the server's `vallen_max` is split by [`PmiClient::put_long`] over several keys and
//! joined again by [`PmiClient::get_long`].
//!
//! The client is generic over `Read + Write`, so it runs over the inherited Unix socket
//! ([`connect_fd`]) or, in tests, over one end of a socket pair served by a fake server.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;

use crate::error::Error;

/// Limits announced by the PMI server (`cmd=maxes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PmiMaxes {
    /// Longest key-value-space name.
    pub kvsname_max: usize,
    /// Longest key, counting the C terminator.
    pub keylen_max: usize,
    /// Longest value, counting the C terminator.
    pub vallen_max: usize,
}

/// A PMI-1 client connection on one stream.
#[derive(Debug)]
pub struct PmiClient<S> {
    stream: S,
    rbuf: Vec<u8>,
    maxes: PmiMaxes,
    kvsname: String,
}

impl<S: Read + Write> PmiClient<S> {
    /// Runs `init`, `get_maxes` and `get_my_kvsname` on `stream`.
    pub fn init(stream: S) -> Result<Self, Error> {
        let mut c = Self {
            stream,
            rbuf: Vec::new(),
            maxes: PmiMaxes {
                kvsname_max: 256,
                keylen_max: 64,
                vallen_max: 1024,
            },
            kvsname: String::new(),
        };
        let r = c.call(
            "cmd=init pmi_version=1 pmi_subversion=1",
            "response_to_init",
        )?;
        if let (Some(v), Some(sv)) = (r.field("pmi_version"), r.field("pmi_subversion")) {
            if v != "1" {
                return Err(pmi_err(format!(
                    "server speaks PMI {v}.{sv}, this client speaks PMI 1.1"
                )));
            }
        }
        let r = c.call("cmd=get_maxes", "maxes")?;
        c.maxes = PmiMaxes {
            kvsname_max: r.number("kvsname_max")?,
            keylen_max: r.number("keylen_max")?,
            vallen_max: r.number("vallen_max")?,
        };
        if c.maxes.vallen_max < 2 || c.maxes.keylen_max < 2 {
            return Err(pmi_err(format!("server limits too small: {:?}", c.maxes)));
        }
        let r = c.call("cmd=get_my_kvsname", "my_kvsname")?;
        let name = r.field("kvsname").unwrap_or_default();
        if name.is_empty() || !is_token(name) {
            return Err(pmi_err(format!("bad kvsname {name:?} from server")));
        }
        c.kvsname = name.to_owned();
        Ok(c)
    }

    /// The job's key-value space.
    pub fn kvsname(&self) -> &str {
        &self.kvsname
    }

    /// The server's limits.
    pub fn maxes(&self) -> PmiMaxes {
        self.maxes
    }

    /// Stores `key = value` in the job's key-value space. The value must fit in
    /// `vallen_max - 1` bytes; see [`put_long`](Self::put_long) for longer ones.
    pub fn put(&mut self, key: &str, value: &str) -> Result<(), Error> {
        self.check_key(key)?;
        if value.is_empty() || !is_token(value) {
            return Err(pmi_err(format!(
                "value for {key:?} is empty or holds spaces or control characters"
            )));
        }
        if value.len() >= self.maxes.vallen_max {
            return Err(pmi_err(format!(
                "value for {key:?} is {} bytes, the server allows {}",
                value.len(),
                self.maxes.vallen_max - 1
            )));
        }
        let line = format!("cmd=put kvsname={} key={key} value={value}", self.kvsname);
        self.call(&line, "put_result").map(drop)
    }

    /// Reads `key` (stored by any rank before the last barrier).
    pub fn get(&mut self, key: &str) -> Result<String, Error> {
        self.check_key(key)?;
        let line = format!("cmd=get kvsname={} key={key}", self.kvsname);
        let r = self.call(&line, "get_result")?;
        Ok(r.field("value").unwrap_or_default().to_owned())
    }

    /// Stores a value of any length: as is when it fits, else split into chunks under
    /// `key.0`, `key.1`, … with `key` holding `#<chunks>`.
    pub fn put_long(&mut self, key: &str, value: &str) -> Result<(), Error> {
        let chunk = self.maxes.vallen_max - 1;
        if value.len() <= chunk && !value.starts_with(CHUNKED) {
            return self.put(key, value);
        }
        if !value.is_ascii() {
            return Err(pmi_err(format!("long value for {key:?} is not ASCII")));
        }
        let parts: Vec<&str> = value
            .as_bytes()
            .chunks(chunk)
            // ASCII (checked above): every byte boundary is a character boundary.
            .map(|c| std::str::from_utf8(c).unwrap_or_default())
            .collect();
        if parts.len() > MAX_CHUNKS {
            return Err(pmi_err(format!(
                "value for {key:?} needs {} chunks, at most {MAX_CHUNKS} allowed",
                parts.len()
            )));
        }
        for (i, p) in parts.iter().enumerate() {
            self.put(&format!("{key}.{i}"), p)?;
        }
        self.put(key, &format!("{CHUNKED}{}", parts.len()))
    }

    /// Reads a value stored with [`put_long`](Self::put_long).
    pub fn get_long(&mut self, key: &str) -> Result<String, Error> {
        let head = self.get(key)?;
        let Some(n) = head.strip_prefix(CHUNKED) else {
            return Ok(head);
        };
        let n: usize = n
            .parse()
            .ok()
            .filter(|n| (1..=MAX_CHUNKS).contains(n))
            .ok_or_else(|| pmi_err(format!("bad chunk count {head:?} under {key:?}")))?;
        let mut out = String::new();
        for i in 0..n {
            out.push_str(&self.get(&format!("{key}.{i}"))?);
        }
        Ok(out)
    }

    /// Waits until every rank of the job has entered the barrier; puts made before it
    /// are visible to every `get` after it.
    pub fn barrier(&mut self) -> Result<(), Error> {
        self.call("cmd=barrier_in", "barrier_out").map(drop)
    }

    /// Ends the PMI conversation (`cmd=finalize`) and returns the stream. Hydra treats a process
    /// that exits without finalizing as failed.
    pub fn finalize(mut self) -> Result<S, Error> {
        self.call("cmd=finalize", "finalize_ack")?;
        Ok(self.stream)
    }

    fn check_key(&self, key: &str) -> Result<(), Error> {
        if key.is_empty() || !is_token(key) || key.contains('=') {
            return Err(pmi_err(format!("bad key {key:?}")));
        }
        if key.len() >= self.maxes.keylen_max {
            return Err(pmi_err(format!(
                "key {key:?} is longer than the server's {} bytes",
                self.maxes.keylen_max - 1
            )));
        }
        Ok(())
    }

    /// Sends one request line and reads the response, checking its `cmd` and `rc`.
    fn call(&mut self, request: &str, expect: &str) -> Result<Response, Error> {
        let mut line = String::with_capacity(request.len() + 1);
        line.push_str(request);
        line.push('\n');
        self.stream
            .write_all(line.as_bytes())
            .and_then(|()| self.stream.flush())
            .map_err(|e| io_err(request, e))?;
        let reply = self.read_line().map_err(|e| io_err(request, e))?;
        let r = Response::parse(&reply);
        if r.field("cmd") != Some(expect) {
            return Err(pmi_err(format!(
                "expected cmd={expect} in answer to {:?}, got {reply:?}",
                first_word(request)
            )));
        }
        match r.field("rc") {
            None | Some("0") => Ok(r),
            Some(rc) => Err(pmi_err(format!(
                "{} failed with rc={rc}{}",
                first_word(request),
                r.message().map(|m| format!(": {m}")).unwrap_or_default()
            ))),
        }
    }

    fn read_line(&mut self) -> io::Result<String> {
        let limit = self.maxes.vallen_max + self.maxes.keylen_max + self.maxes.kvsname_max + 256;
        loop {
            if let Some(pos) = self.rbuf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.rbuf.drain(..=pos).collect();
                return String::from_utf8(line[..pos].to_vec())
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "non-UTF-8 line"));
            }
            if self.rbuf.len() > limit {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("response line longer than {limit} bytes"),
                ));
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "PMI server closed the connection",
                    ))
                }
                Ok(n) => self.rbuf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Adopts the PMI socket whose descriptor number is in `PMI_FD` (passed as `value`).
///
/// The descriptor must be open and a socket (checked through `/proc/self/fd`); from here
/// on the returned stream owns it and closes it on drop, so nothing else in the process
/// may use it.
pub fn connect_fd(value: &str) -> Result<UnixStream, Error> {
    let fd = super::parse_u64("PMI_FD", value, 0, i32::MAX as u64)? as i32;
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .map_err(|e| Error::Wireup(format!("PMI_FD={fd} is not an open descriptor: {e}")))?;
    if !link.to_string_lossy().starts_with("socket:") {
        return Err(Error::Wireup(format!(
            "PMI_FD={fd} is {}, not a socket",
            link.display()
        )));
    }
    Ok(adopt_fd(fd))
}

#[allow(unsafe_code)]
fn adopt_fd(fd: i32) -> UnixStream {
    use std::os::fd::FromRawFd;
    // SAFETY: the caller checked that `fd` is an open socket descriptor. The launcher
    // hands it to this process for PMI alone, and `connect_fd` documents that the stream
    // takes ownership, so no other owner closes or reuses it.
    unsafe { UnixStream::from_raw_fd(fd) }
}

/// A parsed response line: its `key=value` pairs in order.
#[derive(Debug)]
struct Response {
    line: String,
    pairs: Vec<(usize, usize, usize)>,
}

impl Response {
    fn parse(line: &str) -> Self {
        let line = line.trim_end_matches('\r').to_owned();
        let mut pairs = Vec::new();
        let mut off = 0;
        for word in line.split(' ') {
            if let Some(eq) = word.find('=') {
                pairs.push((off, off + eq, off + word.len()));
            }
            off += word.len() + 1;
        }
        Self { line, pairs }
    }

    fn field(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(s, eq, _)| &self.line[*s..*eq] == key)
            .map(|(_, eq, e)| &self.line[eq + 1..*e])
    }

    /// The `msg=` text, which some servers let run to the end of the line.
    fn message(&self) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(s, eq, _)| &self.line[*s..*eq] == "msg")
            .map(|(_, eq, _)| &self.line[eq + 1..])
    }

    fn number(&self, key: &str) -> Result<usize, Error> {
        self.field(key)
            .and_then(|v| v.parse().ok())
            .filter(|n| *n <= 1 << 24)
            .ok_or_else(|| pmi_err(format!("missing or bad {key} in {:?}", self.line)))
    }
}

/// Marks a value split over several keys.
const CHUNKED: &str = "#";

/// Most chunks one long value may span.
const MAX_CHUNKS: usize = 1024;

fn is_token(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_graphic() || b >= 0x80)
}

fn first_word(s: &str) -> &str {
    s.split(' ').next().unwrap_or(s)
}

fn pmi_err(msg: String) -> Error {
    Error::Wireup(format!("PMI: {msg}"))
}

fn io_err(request: &str, e: io::Error) -> Error {
    let what = if matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    ) {
        "no answer within the wire-up timeout".to_owned()
    } else {
        e.to_string()
    };
    pmi_err(format!("{}: {what}", first_word(request)))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::io::{BufRead, BufReader};
    use std::sync::{Arc, Barrier, Mutex};
    use std::thread::{self, JoinHandle};
    use std::time::Duration;

    /// A server that expects exactly `script`'s requests, in order, and sends its replies.
    fn scripted(script: Vec<(&'static str, &'static str)>) -> (UnixStream, JoinHandle<()>) {
        let (client, server) = UnixStream::pair().unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let h = thread::spawn(move || {
            server
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut w = server.try_clone().unwrap();
            let mut r = BufReader::new(server);
            for (want, reply) in script {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                assert_eq!(line, format!("{want}\n"));
                if !reply.is_empty() {
                    w.write_all(reply.as_bytes()).unwrap();
                    w.write_all(b"\n").unwrap();
                }
            }
        });
        (client, h)
    }

    const HELLO: [(&str, &str); 3] = [
        (
            "cmd=init pmi_version=1 pmi_subversion=1",
            "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0",
        ),
        (
            "cmd=get_maxes",
            "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=16",
        ),
        ("cmd=get_my_kvsname", "cmd=my_kvsname rc=0 kvsname=kvs_42_0"),
    ];

    #[test]
    fn scripted_exchange() {
        let mut script = HELLO.to_vec();
        script.extend([
            (
                "cmd=put kvsname=kvs_42_0 key=k0 value=v0",
                "cmd=put_result rc=0",
            ),
            ("cmd=barrier_in", "cmd=barrier_out"),
            (
                "cmd=get kvsname=kvs_42_0 key=k1",
                "cmd=get_result rc=0 value=tcp://1.2.3.4:5",
            ),
            ("cmd=finalize", "cmd=finalize_ack"),
        ]);
        let (s, h) = scripted(script);
        let mut c = PmiClient::init(s).unwrap();
        assert_eq!(c.kvsname(), "kvs_42_0");
        assert_eq!(c.maxes().vallen_max, 16);
        c.put("k0", "v0").unwrap();
        c.barrier().unwrap();
        assert_eq!(c.get("k1").unwrap(), "tcp://1.2.3.4:5");
        c.finalize().unwrap();
        h.join().unwrap();
    }

    #[test]
    fn long_values_are_chunked() {
        // vallen_max=16: at most 15 bytes per value.
        let mut script = HELLO.to_vec();
        script.extend([
            (
                "cmd=put kvsname=kvs_42_0 key=u.0 value=tcp://10.1.0.5:",
                "cmd=put_result rc=0",
            ),
            (
                "cmd=put kvsname=kvs_42_0 key=u.1 value=1;tcp://[fd00::",
                "cmd=put_result rc=0",
            ),
            (
                "cmd=put kvsname=kvs_42_0 key=u.2 value=5]:1",
                "cmd=put_result rc=0",
            ),
            (
                "cmd=put kvsname=kvs_42_0 key=u value=#3",
                "cmd=put_result rc=0",
            ),
            (
                "cmd=get kvsname=kvs_42_0 key=u",
                "cmd=get_result rc=0 value=#2",
            ),
            (
                "cmd=get kvsname=kvs_42_0 key=u.0",
                "cmd=get_result rc=0 value=tcp://10.1.0.5:",
            ),
            (
                "cmd=get kvsname=kvs_42_0 key=u.1",
                "cmd=get_result rc=0 value=1",
            ),
        ]);
        let (s, h) = scripted(script);
        let mut c = PmiClient::init(s).unwrap();
        c.put_long("u", "tcp://10.1.0.5:1;tcp://[fd00::5]:1")
            .unwrap();
        assert_eq!(c.get_long("u").unwrap(), "tcp://10.1.0.5:1");
        drop(c);
        h.join().unwrap();
    }

    #[test]
    fn errors_from_the_server() {
        let mut script = HELLO.to_vec();
        script.extend([
            (
                "cmd=get kvsname=kvs_42_0 key=nope",
                "cmd=get_result rc=-1 msg=key nope not found",
            ),
            ("cmd=barrier_in", "cmd=put_result rc=0"),
            (
                "cmd=get kvsname=kvs_42_0 key=x",
                "cmd=get_result rc=0 value=#9999",
            ),
            ("cmd=barrier_in", ""),
        ]);
        let (s, h) = scripted(script);
        let mut c = PmiClient::init(s).unwrap();
        let e = c.get("nope").unwrap_err().to_string();
        assert!(
            e.contains("rc=-1") && e.contains("key nope not found"),
            "{e}"
        );
        let e = c.barrier().unwrap_err().to_string();
        assert!(e.contains("expected cmd=barrier_out"), "{e}");
        let e = c.get_long("x").unwrap_err().to_string();
        assert!(e.contains("bad chunk count"), "{e}");
        // The server thread exits after reading the last request: EOF.
        let e = c.barrier().unwrap_err().to_string();
        assert!(e.contains("closed"), "{e}");
        h.join().unwrap();
    }

    #[test]
    fn bad_init_and_local_checks() {
        let (s, h) = scripted(vec![(
            "cmd=init pmi_version=1 pmi_subversion=1",
            "cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0",
        )]);
        let e = PmiClient::init(s).unwrap_err().to_string();
        assert!(e.contains("PMI 2.0"), "{e}");
        h.join().unwrap();

        let (s, h) = scripted(HELLO.to_vec());
        let mut c = PmiClient::init(s).unwrap();
        assert!(c.put("a key", "v").is_err());
        assert!(c.put("k=", "v").is_err());
        assert!(c.put("k", "has space").is_err());
        assert!(c.put("k", "").is_err());
        assert!(c
            .put("k", &"x".repeat(16))
            .unwrap_err()
            .to_string()
            .contains("allows 15"));
        assert!(c.put(&"k".repeat(64), "v").is_err());
        drop(c);
        h.join().unwrap();
    }

    #[test]
    fn unterminated_huge_line_is_refused() {
        let (client, mut server) = UnixStream::pair().unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let h = thread::spawn(move || {
            let mut buf = [0u8; 64];
            let _ = server.read(&mut buf);
            let _ = server.write_all(&vec![b'x'; 64 * 1024]);
        });
        let e = PmiClient::init(client).unwrap_err().to_string();
        assert!(e.contains("longer than"), "{e}");
        h.join().unwrap();
    }

    #[test]
    fn connect_fd_checks_the_descriptor() {
        assert!(connect_fd("x").is_err());
        assert!(connect_fd("999999")
            .unwrap_err()
            .to_string()
            .contains("PMI_FD=999999"));
    }

    /// A fake PMI-1 server for `n` ranks sharing one key-value space, one thread per rank.
    pub(crate) fn fake_server(n: usize, vallen_max: usize) -> Vec<UnixStream> {
        let kvs = Arc::new(Mutex::new(HashMap::<String, String>::new()));
        let barrier = Arc::new(Barrier::new(n));
        (0..n)
            .map(|_| {
                let (client, server) = UnixStream::pair().unwrap();
                client
                    .set_read_timeout(Some(Duration::from_secs(10)))
                    .unwrap();
                let (kvs, barrier) = (kvs.clone(), barrier.clone());
                thread::spawn(move || serve_one(server, &kvs, &barrier, vallen_max));
                client
            })
            .collect()
    }

    fn serve_one(
        s: UnixStream,
        kvs: &Mutex<HashMap<String, String>>,
        barrier: &Barrier,
        vl: usize,
    ) {
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        let mut line = String::new();
        while r.read_line(&mut line).unwrap_or(0) > 0 {
            let req = Response::parse(line.trim_end());
            let reply = match req.field("cmd").unwrap_or("") {
                "init" => "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0".to_owned(),
                "get_maxes" => format!("cmd=maxes kvsname_max=64 keylen_max=64 vallen_max={vl}"),
                "get_my_kvsname" => "cmd=my_kvsname rc=0 kvsname=job7".to_owned(),
                "put" => {
                    let (k, v) = (req.field("key").unwrap(), req.field("value").unwrap());
                    assert!(v.len() < vl);
                    kvs.lock().unwrap().insert(k.to_owned(), v.to_owned());
                    "cmd=put_result rc=0".to_owned()
                }
                "barrier_in" => {
                    barrier.wait();
                    "cmd=barrier_out".to_owned()
                }
                "get" => match kvs.lock().unwrap().get(req.field("key").unwrap()) {
                    Some(v) => format!("cmd=get_result rc=0 value={v}"),
                    None => "cmd=get_result rc=-1 msg=not_found".to_owned(),
                },
                "finalize" => "cmd=finalize_ack".to_owned(),
                other => panic!("unexpected request {other}"),
            };
            w.write_all(format!("{reply}\n").as_bytes()).unwrap();
            line.clear();
        }
    }
}
