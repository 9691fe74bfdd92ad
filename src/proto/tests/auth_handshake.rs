//! Pair tests: the challenge-response handshake against peers without the key, replays,
//! reflections, other versions, and what refusals and probe answers reveal.

use super::*;

fn key() -> JobKey {
    JobKey::from_bytes(KEY)
}

fn other_key() -> JobKey {
    JobKey::from_bytes([0x99; 32])
}

/// No record a stranger can get carries a secret: no nonce, no MAC, no key (the job token
/// is the job's name, which records carry).
fn assert_nothing_secret(rec: &[u8]) {
    let h = Hello::parse(rec).expect("a record");
    assert_eq!(h.nonce, [0; NONCE_LEN], "{:?}", h.kind);
    assert_eq!(h.mac, [0; 32], "{:?}", h.kind);
    for secret in [&KEY[..8], &KEY[8..16], &KEY[16..24], &KEY[24..]] {
        assert!(
            !rec[8..].windows(secret.len()).any(|w| w == secret),
            "{:?} carries secret bytes",
            h.kind
        );
    }
}

/// A HELLO claiming a rank, from a process without the key, claims nothing: the endpoint
/// does not change while the handshake runs, the AUTH is refused, and the real rank then
/// connects and its traffic flows.
#[test]
fn forged_hello_claims_no_rank() {
    for seed in 0..30 {
        let mut net = Net::pair(seed);
        let r = net.raw_dial(0);
        net.raw_hello(r, 1);
        net.run(false);
        assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Closed));
        // The CHALLENGE arrived; the forger answers with a MAC of another key.
        let ans = {
            let ch = Hello::parse(&net.raw_read(r)).unwrap();
            assert_eq!(ch.kind, HelloKind::Challenge);
            let t = Transcript {
                job_d: TOKEN,
                job_a: TOKEN,
                nonce_d: &RAW_NONCE,
                nonce_a: &ch.nonce,
                pid_d: PeerId(1),
                pid_a: PeerId(0),
                link: 0,
            };
            let mut a = Hello::new(HelloKind::Auth, PeerId(1));
            a.mac = auth::handshake_mac(&other_key(), Side::Dialer, &t);
            net.raw_write(r, &a.to_bytes());
            net.run(false);
            net.raw_read(r)
        };
        let ctx = format!("seed {seed}");
        assert_eq!(
            Hello::parse(&ans).unwrap().kind,
            HelloKind::Reject(RejectReason::AuthFailed),
            "{ctx}"
        );
        assert_nothing_secret(&ans);
        assert!(net.raw_eof(r), "{ctx}");
        assert_eq!(net.core(0).counters().auth_failed, 1, "{ctx}");
        assert_eq!(
            net.count_events(0, |e| *e
                == CoreEvent::Refused {
                    why: ProtoError::AuthFailed
                }),
            1
        );
        assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Closed));
        // The real rank 1 connects; both directions flow.
        net.send(1, 0, 1, b"the real one".to_vec()).unwrap();
        net.send(0, 1, 2, b"welcome".to_vec()).unwrap();
        net.drive();
        net.assert_all_delivered(1, 0);
        net.assert_all_delivered(0, 1);
        assert!(net.failed_events(0).is_empty() && net.failed_events(1).is_empty());
    }
}

/// Two processes with different keys never connect, whoever dials: the dialer refuses
/// the acceptor's CHALLENGE and sends nothing more.
#[test]
fn wrong_key_is_refused_either_way() {
    for (dialer, seed) in [(0usize, 1u64), (1, 2), (0, 3), (1, 4)] {
        let mut c1 = cfg(1);
        c1.job_key = Some(other_key());
        let mut net = Net::new(seed, vec![cfg(0), c1]);
        let acceptor = 1 - dialer;
        net.send(dialer, acceptor as u32, 1, b"x".to_vec()).unwrap();
        net.drive();
        let failed = net.failed_events(dialer);
        assert_eq!(failed.len(), 1);
        assert!(matches!(
            failed[0].1,
            FailReason::Protocol {
                err: ProtoError::AuthFailed,
                ..
            }
        ));
        assert_eq!(net.core(dialer).counters().auth_failed, 1);
        assert!(net.received(acceptor, dialer).is_empty());
        assert_eq!(
            net.core(acceptor).state(PeerId(dialer as u32)),
            Some(EndpointState::Closed)
        );
        // Only HELLO left the dialer: no AUTH after a CHALLENGE that did not verify.
        for s in 0..net.socks.len() {
            if net.socks[s].dialer {
                assert_eq!(net.socks[s].head.len(), HELLO_LEN);
            }
        }
    }
}

/// An AUTH recorded from one handshake is refused in the next: the acceptor's nonce is
/// fresh each time.
#[test]
fn replayed_auth_is_refused() {
    let mut net = Net::pair(7);
    let r = net.raw_dial(0);
    net.raw_hello(r, 1);
    net.run(false);
    let ch = Hello::parse(&net.raw_read(r)).unwrap();
    let t = Transcript {
        job_d: TOKEN,
        job_a: TOKEN,
        nonce_d: &RAW_NONCE,
        nonce_a: &ch.nonce,
        pid_d: PeerId(1),
        pid_a: PeerId(0),
        link: 0,
    };
    let mut recorded = Hello::new(HelloKind::Auth, PeerId(1));
    recorded.to = PeerId(0);
    recorded.mac = auth::handshake_mac(&key(), Side::Dialer, &t);
    net.raw_write(r, &recorded.to_bytes());
    net.run(false);
    assert_eq!(
        Hello::parse(&net.raw_read(r)).unwrap().kind,
        HelloKind::Accept
    );
    net.raw_close(r);
    net.drive();
    // The same HELLO, then the recorded AUTH, on a new connection.
    let r2 = net.raw_dial(0);
    net.raw_hello(r2, 1);
    net.run(false);
    let ch2 = Hello::parse(&net.raw_read(r2)).unwrap();
    assert_ne!(ch2.nonce, ch.nonce, "a fresh nonce per handshake");
    net.raw_write(r2, &recorded.to_bytes());
    net.run(false);
    let ans = net.raw_read(r2);
    assert_eq!(
        Hello::parse(&ans).unwrap().kind,
        HelloKind::Reject(RejectReason::AuthFailed)
    );
    assert_nothing_secret(&ans);
    assert_eq!(net.core(0).counters().auth_failed, 1);
}

/// The acceptor's own MAC sent back as the dialer's proves nothing (the labels differ),
/// nor does a MAC made for another process id.
#[test]
fn reflected_and_misattributed_macs_are_refused() {
    let mut net = Net::pair(9);
    let r = net.raw_dial(0);
    net.raw_hello(r, 1);
    net.run(false);
    let ch = Hello::parse(&net.raw_read(r)).unwrap();
    let mut a = Hello::new(HelloKind::Auth, PeerId(1));
    a.mac = ch.mac;
    net.raw_write(r, &a.to_bytes());
    net.run(false);
    assert_eq!(
        Hello::parse(&net.raw_read(r)).unwrap().kind,
        HelloKind::Reject(RejectReason::AuthFailed)
    );
    // A valid MAC for pid 1, sent in an AUTH that claims pid 2 after a HELLO of pid 1.
    let r = net.raw_dial(0);
    net.raw_hello(r, 1);
    net.run(false);
    let ch = Hello::parse(&net.raw_read(r)).unwrap();
    let t = Transcript {
        job_d: TOKEN,
        job_a: TOKEN,
        nonce_d: &RAW_NONCE,
        nonce_a: &ch.nonce,
        pid_d: PeerId(1),
        pid_a: PeerId(0),
        link: 0,
    };
    let mut a = Hello::new(HelloKind::Auth, PeerId(2));
    a.mac = auth::handshake_mac(&key(), Side::Dialer, &t);
    net.raw_write(r, &a.to_bytes());
    net.run(false);
    assert_eq!(
        Hello::parse(&net.raw_read(r)).unwrap().kind,
        HelloKind::Reject(RejectReason::AuthFailed)
    );
    assert_eq!(net.core(0).counters().auth_failed, 2);
    assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Closed));
}

/// A dialer whose acceptor skips the CHALLENGE, or proves another key, sends no AUTH
/// and no frame.
#[test]
fn dialer_sends_nothing_to_an_acceptor_without_the_key() {
    for answer in ["accept", "bad challenge"] {
        let mut net = Net::pair(11);
        net.listeners.insert(addr(1), Listener::Raw);
        net.send(0, 1, 1, b"secret payload".to_vec()).unwrap();
        net.run(false);
        let r = net.raw_accepted[0];
        let hello = Hello::parse(&net.raw_read(r)).unwrap();
        assert_eq!((hello.kind, hello.to), (HelloKind::Hello, PeerId(1)));
        let rec = match answer {
            "accept" => Hello::new(HelloKind::Accept, PeerId(1)),
            _ => {
                let mut c = Hello::new(HelloKind::Challenge, PeerId(1));
                c.to = PeerId(0);
                c.nonce = [5; NONCE_LEN];
                c.mac = [6; 32];
                c
            }
        };
        net.raw_write(r, &rec.to_bytes());
        net.run(false);
        assert!(net.raw_read(r).is_empty(), "{answer}: nothing after HELLO");
        assert!(net.raw_eof(r), "{answer}");
        assert_eq!(net.failed_events(0).len(), 1, "{answer}");
        assert!(net.completions(0).values().all(Result::is_err), "{answer}");
    }
}

/// Version 1's 24-byte HELLO gets `REJECT(Version)` at once, readable by a version-1
/// peer; a version-1 acceptor's REJECT fails our dial with both versions named.
#[test]
fn other_versions_get_a_clear_error_both_ways() {
    let mut v1 = [0u8; 24];
    v1[..8].copy_from_slice(&crate::wire::MAGIC);
    v1[8..10].copy_from_slice(&1u16.to_be_bytes());
    v1[10] = 1;
    v1[12..16].copy_from_slice(&1u32.to_be_bytes());
    v1[16..24].copy_from_slice(&TOKEN.to_be_bytes());
    let mut net = Net::pair(13);
    let r = net.raw_dial(0);
    net.raw_write(r, &v1);
    net.drive();
    let ans = net.raw_read(r);
    assert_eq!(
        (u16::from_be_bytes([ans[8], ans[9]]), ans[10], ans[11]),
        (VERSION, 3, 6),
        "REJECT(Version) at version 1's offsets"
    );
    assert_nothing_secret(&ans);
    let why = ProtoError::UnsupportedVersion {
        got: 1,
        ours: VERSION,
    };
    assert_eq!(
        net.count_events(0, |e| *e == CoreEvent::Refused { why: why.clone() }),
        1
    );
    // Our dial answered by a version-1 acceptor's REJECT(Version).
    let mut net = Net::pair(14);
    net.listeners.insert(addr(1), Listener::Raw);
    net.send(0, 1, 1, b"x".to_vec()).unwrap();
    net.run(false);
    let r = net.raw_accepted[0];
    let mut rej = v1;
    rej[10] = 3;
    rej[11] = 6;
    net.raw_write(r, &rej);
    net.run(false);
    let failed = net.failed_events(0);
    assert_eq!(failed.len(), 1);
    assert_eq!(
        failed[0].1,
        FailReason::Protocol {
            peer: PeerId(1),
            err: why
        }
    );
}

/// A probe is answered "alive" with the listener's id, nothing more; refusals carry
/// their reason only.
#[test]
fn probe_and_reject_answers_carry_nothing_secret() {
    let mut net = Net::pair(15);
    let r = net.raw_dial(0);
    net.raw_write(r, &Hello::new(HelloKind::Probe, PeerId::ANY).to_bytes());
    net.drive();
    let ans = net.raw_read(r);
    let h = Hello::parse(&ans).unwrap();
    assert_eq!((h.kind, h.pid), (HelloKind::ProbeAck, PeerId(0)));
    assert_nothing_secret(&ans);
    assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Closed));
    for pid in [99, 1] {
        let r = net.raw_dial(0);
        net.raw_hello(r, pid);
        let ans = net.raw_auth(r, pid, &other_key(), TOKEN).unwrap();
        assert_eq!(ans.kind, HelloKind::Reject(RejectReason::AuthFailed));
        assert_nothing_secret(&ans.to_bytes());
    }
    // The unknown process with the key: refused after its proof, with the reason only.
    let r = net.raw_dial(0);
    net.raw_hello(r, 99);
    let ans = net.raw_auth(r, 99, &key(), TOKEN).unwrap();
    assert_eq!(ans.kind, HelloKind::Reject(RejectReason::UnknownPeer));
    assert_nothing_secret(&ans.to_bytes());
}

/// Without a key on either side the same exchange runs with the public key: processes
/// connect, a process holding a key refuses them.
#[test]
fn no_key_means_the_public_key() {
    let mut c0 = cfg(0);
    let mut c1 = cfg(1);
    c0.job_key = None;
    c1.job_key = None;
    let mut net = Net::new(17, vec![c0, c1]);
    assert!(!net.core(0).authenticated());
    net.send(0, 1, 1, b"open".to_vec()).unwrap();
    net.drive();
    net.assert_all_delivered(0, 1);
    let mut c1 = cfg(1);
    c1.job_key = None;
    let mut net = Net::new(18, vec![cfg(0), c1]);
    assert!(net.core(0).authenticated());
    net.send(1, 0, 1, b"x".to_vec()).unwrap();
    net.drive();
    assert_eq!(net.failed_events(1).len(), 1);
    assert!(net.received(0, 1).is_empty());
}
