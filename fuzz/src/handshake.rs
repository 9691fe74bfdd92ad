//! The authenticated handshake against a peer that sends arbitrary records.
//!
//! One engine (`Core`, pid 0, knowing peer 1, job key `KEY`, every nonce it draws known in
//! advance) either accepts a connection (`dialer: false`) or dials peer 1 (`dialer:
//! true`). The peer's side is a list of records: well-formed ones of every kind (a HELLO,
//! the AUTH or CHALLENGE that proves the key for this handshake, ACCEPT, REJECT, PROBE...),
//! each possibly made with another key or pid or with bytes flipped, or arbitrary bytes.
//! The stream is read in arbitrary cuts. Every byte the engine writes is captured.
//!
//! Properties:
//! - no panic, and every walk ends;
//! - everything the engine writes before its endpoint is Connected is whole handshake
//!   records of our version, except the frames a dialer writes right behind its AUTH;
//! - REJECT and PROBE_ACK records carry a zero nonce and MAC (nothing secret);
//! - acceptor: a CHALLENGE's MAC proves the key over the HELLO's nonce, pid and link; the
//!   endpoint becomes Connected only when the peer sent exactly the HELLO and then the AUTH
//!   that prove the key (and the endpoint's state does not change before);
//! - dialer: the engine sends AUTH only after a CHALLENGE whose MAC verifies, and is
//!   Connected only after such a CHALLENGE followed by ACCEPT.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use bytes::Bytes;
use ringbtl::auth::{handshake_mac, verify_handshake, JobKey, Side, Transcript};
use ringbtl::proto::core::{
    Action, ConnKey, Core, CoreConfig, CoreEvent, EndpointState, NonceSource, Step,
};
use ringbtl::wire::{Hello, HelloKind, PeerId, RejectReason, Tag, HELLO_LEN, MAC_LEN, NONCE_LEN};

const TOKEN: u64 = 0x0123_4567_89ab_cdef;
const KEY: [u8; 32] = [0x4b; 32];
const ME: PeerId = PeerId(0);
const PEER: PeerId = PeerId(1);
/// The nonce the peer puts in its HELLO.
const NONCE_D: [u8; NONCE_LEN] = [0x3c; NONCE_LEN];
/// Every nonce the engine draws.
const NONCE_E: [u8; NONCE_LEN] = [0x11; NONCE_LEN];
const CONN: ConnKey = ConnKey(0);
const STEP_LIMIT: usize = 1 << 16;

/// One fuzz case.
#[derive(Debug, Arbitrary)]
pub struct Input {
    /// The engine dials (else it accepts).
    pub dialer: bool,
    /// What the peer sends, in order.
    pub records: Vec<Rec>,
    /// Sizes of the successive reads (0: all there is).
    pub cuts: Vec<u8>,
    /// The engine's sends complete only after the peer's bytes are read (else at once).
    pub late_sends: bool,
}

/// One record of the peer.
#[derive(Debug, Arbitrary)]
pub enum Rec {
    /// A well-formed record.
    Good {
        /// What it is.
        kind: Kind,
        /// Made with another key.
        wrong_key: bool,
        /// From this pid instead of the peer's (`None`: the peer's).
        pid: Option<u32>,
        /// Bytes to flip: (offset modulo the record, mask).
        flips: Vec<(u8, u8)>,
    },
    /// Arbitrary bytes.
    Raw(Vec<u8>),
}

/// Record kinds the peer may send.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Kind {
    /// HELLO with the peer's nonce.
    Hello,
    /// The CHALLENGE for the engine's HELLO (its MAC proves the key).
    Challenge,
    /// The AUTH for the engine's CHALLENGE (its MAC proves the key).
    Auth,
    /// The acceptor's MAC reflected as an AUTH.
    Reflected,
    /// ACCEPT.
    Accept,
    /// REJECT with a reason code.
    Reject(u8),
    /// PROBE.
    Probe,
    /// PROBE_ACK.
    ProbeAck,
}

/// The MAC of `side` for a handshake between dialer `pid_d` and acceptor `pid_a`, with
/// the peer's nonce as `Nd` when the engine accepts, as `Na` when it dials.
fn mac(key: &JobKey, side: Side, dialer: bool, pid_d: PeerId, pid_a: PeerId) -> [u8; MAC_LEN] {
    let (nd, na) = if dialer {
        (NONCE_E, NONCE_D)
    } else {
        (NONCE_D, NONCE_E)
    };
    handshake_mac(
        key,
        side,
        &Transcript {
            job_d: TOKEN,
            job_a: TOKEN,
            nonce_d: &nd,
            nonce_a: &na,
            pid_d,
            pid_a,
            link: 0,
        },
    )
}

fn reason(c: u8) -> RejectReason {
    match c % 10 {
        0 => RejectReason::Simultaneous,
        1 => RejectReason::Duplicate,
        2 => RejectReason::UnknownPeer,
        3 => RejectReason::AuthFailed,
        4 => RejectReason::ShuttingDown,
        5 => RejectReason::Version,
        6 => RejectReason::NoLink,
        7 => RejectReason::LinksOff,
        8 => RejectReason::UnknownJob,
        _ => RejectReason::Unreachable,
    }
}

/// The bytes of one record.
fn encode(r: &Rec, dialer: bool) -> Vec<u8> {
    match r {
        Rec::Raw(b) => b.clone(),
        Rec::Good {
            kind,
            wrong_key,
            pid,
            flips,
        } => {
            let key = if *wrong_key {
                JobKey::from_bytes([0x99; 32])
            } else {
                JobKey::from_bytes(KEY)
            };
            let from = pid.map_or(PEER, PeerId);
            let mut h = Hello::new(HelloKind::Hello, from);
            (h.to, h.job, h.to_job) = (ME, TOKEN, TOKEN);
            match kind {
                Kind::Hello => h.nonce = NONCE_D,
                Kind::Challenge => {
                    h.kind = HelloKind::Challenge;
                    h.nonce = NONCE_D;
                    h.mac = mac(&key, Side::Acceptor, dialer, ME, from);
                }
                Kind::Auth => {
                    h.kind = HelloKind::Auth;
                    h.mac = mac(&key, Side::Dialer, dialer, from, ME);
                }
                Kind::Reflected => {
                    h.kind = HelloKind::Auth;
                    h.mac = mac(&key, Side::Acceptor, dialer, from, ME);
                }
                Kind::Accept => h.kind = HelloKind::Accept,
                Kind::Reject(c) => h.kind = HelloKind::Reject(reason(*c)),
                Kind::Probe => h.kind = HelloKind::Probe,
                Kind::ProbeAck => h.kind = HelloKind::ProbeAck,
            }
            let mut b = h.to_bytes().to_vec();
            for (at, mask) in flips {
                b[usize::from(*at) % HELLO_LEN] ^= mask;
            }
            b
        }
    }
}

struct Driver {
    core: Core,
    inbox: VecDeque<u8>,
    rx: Option<ringbtl::buf::RxBuf>,
    tx: Option<ringbtl::buf::TxBatch>,
    /// Everything the engine wrote on the connection.
    wrote: Vec<u8>,
    /// Bytes written before the endpoint was Connected.
    before_connected: Option<usize>,
    closed: bool,
    dialed: bool,
    late_sends: bool,
}

/// Runs every check on `input`; panics on a violation.
pub fn run(input: &Input) {
    run_case(input);
}

/// [`run`], saying whether the engine ended Connected.
pub fn run_case(input: &Input) -> bool {
    let cfg = CoreConfig {
        pid: ME,
        token: TOKEN,
        job_key: Some(JobKey::from_bytes(KEY)),
        recv_cache: 4096,
        max_frame: 1 << 16,
        handshake_timeout: Duration::from_secs(5),
        ..CoreConfig::default()
    };
    let mut core = Core::with_nonces(cfg, NonceSource::new(|| Some(NONCE_E)));
    core.add_peer(PEER, vec![SocketAddr::from(([10, 0, 0, 2], 7000))])
        .expect("peer 1 is valid");
    let mut stream = Vec::new();
    for r in &input.records {
        stream.extend_from_slice(&encode(r, input.dialer));
    }
    let mut d = Driver {
        core,
        inbox: stream.clone().into(),
        rx: None,
        tx: None,
        wrote: Vec::new(),
        before_connected: None,
        closed: false,
        dialed: false,
        late_sends: input.late_sends,
    };
    let base = Instant::now();
    if input.dialer {
        d.core
            .send(base, PEER, Tag(1), &[Bytes::from_static(b"first")], 1)
            .expect("a send to a known peer");
        d.pump();
        assert!(d.dialed, "the first send dials");
        d.core.handle_connected(base, CONN, Ok(()));
    } else {
        d.core.handle_accepted(base, CONN);
    }
    d.pump();
    let mut cuts = input.cuts.iter().copied().cycle().take(1 << 12);
    while !d.inbox.is_empty() && !d.closed {
        let n = cuts.next().map_or(usize::MAX, usize::from);
        if !d.read(if n == 0 { usize::MAX } else { n }) {
            break;
        }
        d.pump();
    }
    d.finish_send();
    d.pump();
    check(&d, input.dialer, &stream);
    d.core.state(PEER) == Some(EndpointState::Connected)
}

/// The peer's `i`th record as the engine reads it: the stream's bytes at `i × HELLO_LEN`.
fn peer_record(stream: &[u8], i: usize) -> Option<Hello> {
    stream
        .get(i * HELLO_LEN..(i + 1) * HELLO_LEN)
        .and_then(|b| Hello::parse(b).ok())
}

/// The engine's writes against what the peer's records prove.
fn check(d: &Driver, dialer: bool, stream: &[u8]) {
    let connected = d.core.state(PEER) == Some(EndpointState::Connected);
    // Whole records of ours, up to the connection (frames may follow).
    let hs = d.before_connected.unwrap_or(d.wrote.len());
    let recs = records_before_frames(&d.wrote[..hs], dialer);
    for r in &recs {
        if matches!(
            r.kind,
            HelloKind::Reject(_) | HelloKind::ProbeAck | HelloKind::Accept
        ) {
            assert_eq!(r.nonce, [0; NONCE_LEN], "{:?} carries a nonce", r.kind);
            assert_eq!(r.mac, [0; MAC_LEN], "{:?} carries a MAC", r.kind);
        }
    }
    let key = JobKey::from_bytes(KEY);
    let (r0, r1) = (peer_record(stream, 0), peer_record(stream, 1));
    if dialer {
        assert!(
            recs.first()
                .is_some_and(|h| h.kind == HelloKind::Hello && h.to == PEER && h.nonce == NONCE_E),
            "the dialer opens with its HELLO: {recs:?}"
        );
        // The acceptor's proof: a CHALLENGE from the peer whose MAC covers our nonce.
        let proved = r0.is_some_and(|c| {
            c.kind == HelloKind::Challenge
                && c.pid == PEER
                && verify_handshake(
                    &key,
                    Side::Acceptor,
                    &Transcript {
                        job_d: TOKEN,
                        job_a: TOKEN,
                        nonce_d: &NONCE_E,
                        nonce_a: &c.nonce,
                        pid_d: ME,
                        pid_a: PEER,
                        link: 0,
                    },
                    &c.mac,
                )
        });
        let sent_auth = recs.iter().any(|h| h.kind == HelloKind::Auth);
        assert!(
            !sent_auth || proved,
            "AUTH sent without a CHALLENGE that proves the key"
        );
        if connected {
            assert!(
                sent_auth && r1.is_some_and(|a| a.kind == HelloKind::Accept),
                "connected without the proof"
            );
        }
    } else {
        let hello = r0.filter(|h| h.kind == HelloKind::Hello);
        if let (Some(h), Some(ch)) = (hello, recs.iter().find(|h| h.kind == HelloKind::Challenge)) {
            let t = Transcript {
                job_d: TOKEN,
                job_a: TOKEN,
                nonce_d: &h.nonce,
                nonce_a: &ch.nonce,
                pid_d: h.pid,
                pid_a: ME,
                link: h.link,
            };
            assert_eq!((ch.pid, ch.to), (ME, h.pid));
            assert!(
                verify_handshake(&key, Side::Acceptor, &t, &ch.mac),
                "CHALLENGE's MAC"
            );
        }
        if connected {
            let proved = match (hello, r1) {
                (Some(h), Some(a)) => {
                    a.kind == HelloKind::Auth
                        && h.pid == PEER
                        && a.pid == PEER
                        && verify_handshake(
                            &key,
                            Side::Dialer,
                            &Transcript {
                                job_d: TOKEN,
                                job_a: TOKEN,
                                nonce_d: &h.nonce,
                                nonce_a: &NONCE_E,
                                pid_d: PEER,
                                pid_a: ME,
                                link: h.link,
                            },
                            &a.mac,
                        )
                }
                _ => false,
            };
            assert!(proved, "an endpoint claimed without the key");
            // The ACCEPT leaves right after the decision (with the first frames).
            let accept = d
                .wrote
                .get(hs..hs + HELLO_LEN)
                .and_then(|b| Hello::parse(b).ok());
            assert_eq!(accept.map(|h| h.kind), Some(HelloKind::Accept));
        } else if hello.is_some() && r1.is_none() {
            // Nothing proved yet: the endpoint has not moved.
            assert_eq!(d.core.state(PEER), Some(EndpointState::Closed));
        }
    }
}

/// The handshake records at the start of what the engine wrote before Connected. Only a
/// dialer (whose id, 0, is below the peer's) may follow its AUTH with frames, which wait
/// there for the ACCEPT; anything else is whole records.
fn records_before_frames(bytes: &[u8], dialer: bool) -> Vec<Hello> {
    let mut recs = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        assert!(rest.len() >= HELLO_LEN, "partial record written");
        let (rec, tail) = rest.split_at(HELLO_LEN);
        let h = Hello::parse(rec).expect("the engine writes valid records");
        rest = tail;
        recs.push(h);
        if dialer && h.kind == HelloKind::Auth {
            break;
        }
    }
    recs
}

impl Driver {
    fn pump(&mut self) {
        for _ in 0..STEP_LIMIT {
            // Events first: a Connected event marks where the handshake's bytes end.
            self.events();
            self.core.flush();
            let Some(a) = self.core.poll_action() else {
                break;
            };
            self.action(a);
        }
        self.events();
    }

    fn events(&mut self) {
        while let Some(ev) = self.core.poll_event() {
            if let CoreEvent::Connected(p) = ev {
                assert_eq!(p, PEER);
                self.before_connected.get_or_insert(self.wrote.len());
            }
        }
    }

    fn action(&mut self, a: Action) {
        match a {
            Action::Dial { peer, .. } => {
                assert_eq!(peer, PEER);
                assert!(!self.dialed, "one dial");
                self.dialed = true;
                self.core.dial_started(peer, 0, CONN);
            }
            Action::Transmit { conn, batch } => {
                assert_eq!(conn, CONN);
                assert!(self.tx.is_none(), "two sends in flight");
                self.wrote.extend_from_slice(&batch.unsent_to_vec());
                self.tx = Some(batch);
                if !self.late_sends {
                    self.finish_send();
                }
            }
            Action::Receive { conn, buf } => {
                assert_eq!(conn, CONN);
                assert!(self.rx.is_none(), "two reads armed");
                self.rx = Some(buf);
            }
            Action::ArmProvided(_) | Action::PauseProvided(_) => {
                panic!("no multishot receive here")
            }
            Action::Close(conn) | Action::Reset(conn) => {
                assert_eq!(conn, CONN);
                assert!(!self.closed, "closed twice");
                self.closed = true;
            }
            Action::Probe(_) => panic!("no link to probe here"),
            Action::Walk { .. } => panic!("no reading held here"),
        }
    }

    fn finish_send(&mut self) {
        if let Some(b) = self.tx.take() {
            self.core.handle_sent(Instant::now(), CONN, b, Ok(()));
        }
    }

    /// One read of up to `max` bytes, walked; false when no read is armed.
    fn read(&mut self, max: usize) -> bool {
        if self.late_sends {
            self.finish_send();
            self.pump();
        }
        let Some(mut rx) = self.rx.take() else {
            return false;
        };
        let spare = rx.spare_mut();
        let n = max.min(spare.len()).min(self.inbox.len());
        for (d, b) in spare.iter_mut().zip(self.inbox.drain(..n)) {
            *d = b;
        }
        rx.commit(n);
        let now = Instant::now();
        for _ in 0..STEP_LIMIT {
            match self.core.recv_step(now, CONN, &mut rx) {
                Step::Deliver { range, .. } => {
                    assert!(
                        self.core.state(PEER) == Some(EndpointState::Connected),
                        "a frame delivered before the handshake ended"
                    );
                    std::hint::black_box(rx.bytes(range));
                }
                Step::Rearm => {
                    self.core.recv_done(CONN, rx);
                    return true;
                }
                Step::Drop => return false,
            }
        }
        panic!("recv_step walk does not end");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good(kind: Kind) -> Rec {
        Rec::Good {
            kind,
            wrong_key: false,
            pid: None,
            flips: Vec::new(),
        }
    }

    /// The harness reaches both outcomes: the checks above are not vacuous.
    #[test]
    fn honest_peers_connect_and_forgers_do_not() {
        for late_sends in [false, true] {
            for cuts in [vec![], vec![1], vec![7, 100]] {
                let acceptor = Input {
                    dialer: false,
                    records: vec![good(Kind::Hello), good(Kind::Auth)],
                    cuts: cuts.clone(),
                    late_sends,
                };
                assert!(run_case(&acceptor));
                let dialer = Input {
                    dialer: true,
                    records: vec![good(Kind::Challenge), good(Kind::Accept)],
                    cuts: cuts.clone(),
                    late_sends,
                };
                assert!(run_case(&dialer));
                for forged in [
                    vec![good(Kind::Hello), good(Kind::Reflected)],
                    vec![
                        good(Kind::Hello),
                        Rec::Good {
                            kind: Kind::Auth,
                            wrong_key: true,
                            pid: None,
                            flips: Vec::new(),
                        },
                    ],
                ] {
                    let i = Input {
                        dialer: false,
                        records: forged,
                        cuts: cuts.clone(),
                        late_sends,
                    };
                    assert!(!run_case(&i));
                }
                let skip = Input {
                    dialer: true,
                    records: vec![good(Kind::Accept)],
                    cuts,
                    late_sends,
                };
                assert!(!run_case(&skip));
            }
        }
    }
}
