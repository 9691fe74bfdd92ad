//! The job key over real sockets: a forged HELLO claims no rank, refusals and probe
//! answers carry nothing secret, the key set by its variable's name authenticates, and
//! `RINGBTL_AUTH=required` refuses to start without one.

mod common;

use std::cell::RefCell;
use std::io::Write;
use std::net::TcpStream;
use std::rc::Rc;
use std::time::Duration;

use common::{completions, drive, failures, raw_handshake, read_record};
use ringbtl::auth::JobKey;
use ringbtl::wire::{Hello, HelloKind, PeerId, RejectReason, Tag};
use ringbtl::{BackendKind, Config, Transport};

const KEY_HEX: &str = "5ad1c0ffee5ad1c0ffee5ad1c0ffee5ad1c0ffee5ad1c0ffee5ad1c0ffee5ad1";
const TOKEN: u64 = 0x1122_3344_5566_7788;

fn key() -> JobKey {
    JobKey::from_hex(KEY_HEX).unwrap()
}

/// A config with the job key set by its variable's name, as the C ABI does.
fn keyed(pid: u32, kind: BackendKind) -> Config {
    let mut c = common::cfg(pid, kind);
    c.set("RINGBTL_JOB_KEY", KEY_HEX).unwrap();
    c.core.token = TOKEN;
    c
}

fn keyed_pair(kind: BackendKind) -> (Transport, Transport) {
    let mut a = Transport::new(keyed(0, kind)).unwrap();
    let mut b = Transport::new(keyed(1, kind)).unwrap();
    a.add_peer(PeerId(1), vec![b.local_addr()]).unwrap();
    b.add_peer(PeerId(0), vec![a.local_addr()]).unwrap();
    (a, b)
}

/// Every payload received on `tag`.
fn collect(t: &mut Transport, tag: Tag) -> Rc<RefCell<Vec<Vec<u8>>>> {
    let got = Rc::new(RefCell::new(Vec::new()));
    let g = got.clone();
    t.register(tag, move |_, am| g.borrow_mut().push(am.payload.to_vec()))
        .unwrap();
    got
}

/// No secret byte in `rec`: no 8 bytes of the key, no nonce, no MAC (the job token is
/// the job's name, which records carry).
fn assert_nothing_secret(rec: &[u8]) {
    let h = Hello::parse(rec).unwrap();
    assert_eq!((h.nonce, h.mac), ([0; 32], [0; 32]), "{:?}", h.kind);
    let k = key().to_hex();
    let kb: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&k[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    for secret in kb.windows(8) {
        assert!(
            !rec.windows(secret.len()).any(|w| w == secret),
            "{:?} carries secret bytes",
            h.kind
        );
    }
}

/// A process without the key dials rank 1 claiming to be rank 0: refused after its AUTH,
/// rank 1's endpoint for 0 untouched; then the real rank 0 connects and traffic flows
/// both ways. (Before, the forger became rank 0 and the real one was a duplicate.)
fn forged_hello_is_refused_and_the_real_rank_connects(kind: BackendKind) {
    let (mut a, mut b) = keyed_pair(kind);
    let mut s = TcpStream::connect(b.local_addr()).unwrap();
    let wrong = JobKey::from_bytes([0x77; 32]);
    let ans = raw_handshake(&mut s, &mut [&mut b], PeerId(0), PeerId(1), &wrong)
        .expect("an answer to the forged AUTH");
    assert_eq!(ans.kind, HelloKind::Reject(RejectReason::AuthFailed));
    assert_nothing_secret(&ans.to_bytes());
    assert_eq!(b.stats().auth_failed, 1);
    assert_eq!(
        b.peer_state(PeerId(0)),
        Some(ringbtl::proto::core::EndpointState::Closed)
    );
    let got_b = collect(&mut b, Tag(1));
    let got_a = collect(&mut a, Tag(2));
    let ca = completions(&mut a);
    let cb = completions(&mut b);
    a.send(PeerId(1), Tag(1), &[bytes::Bytes::from_static(b"real")], 1)
        .unwrap();
    b.send(PeerId(0), Tag(2), &[bytes::Bytes::from_static(b"back")], 2)
        .unwrap();
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "traffic",
        || got_a.borrow().len() == 1 && got_b.borrow().len() == 1,
    );
    assert_eq!(got_b.borrow()[0], b"real");
    assert_eq!(got_a.borrow()[0], b"back");
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "completions",
        || ca.borrow().len() == 1 && cb.borrow().len() == 1,
    );
    assert!(ca.borrow()[0].result.is_ok() && cb.borrow()[0].result.is_ok());
    assert!(a.authenticated() && b.authenticated());
}

/// A prober, with or without the key, learns nothing secret: the PROBE answer is
/// "alive" and the id; a REJECT carries its reason only.
fn probes_and_rejects_carry_nothing_secret(kind: BackendKind) {
    let (_a, mut b) = keyed_pair(kind);
    // PROBE, by hand, so that the answer's bytes can be read.
    let mut s = TcpStream::connect(b.local_addr()).unwrap();
    s.write_all(&Hello::new(HelloKind::Probe, PeerId::ANY).to_bytes())
        .unwrap();
    let ack = read_record(&mut s, &mut [&mut b], "PROBE_ACK").unwrap();
    assert_eq!((ack.kind, ack.pid), (HelloKind::ProbeAck, PeerId(1)));
    assert_nothing_secret(&ack.to_bytes());
    // REJECT for a wrong key, an unknown id with the key, a version mismatch.
    for (pid, k) in [(0, JobKey::from_bytes([1; 32])), (9, key())] {
        let mut s = TcpStream::connect(b.local_addr()).unwrap();
        let ans = raw_handshake(&mut s, &mut [&mut b], PeerId(pid), PeerId(1), &k).unwrap();
        assert!(matches!(ans.kind, HelloKind::Reject(_)), "{ans:?}");
        assert_nothing_secret(&ans.to_bytes());
    }
    let mut s = TcpStream::connect(b.local_addr()).unwrap();
    let mut v1 = [0u8; 24];
    v1[..8].copy_from_slice(&ringbtl::wire::MAGIC);
    v1[8..10].copy_from_slice(&1u16.to_be_bytes());
    v1[10] = 1;
    v1[16..24].copy_from_slice(&TOKEN.to_be_bytes());
    s.write_all(&v1).unwrap();
    let rej = read_record(&mut s, &mut [&mut b], "REJECT(Version)").unwrap();
    assert_eq!(rej.kind, HelloKind::Reject(RejectReason::Version));
    assert_nothing_secret(&rej.to_bytes());
}

/// Processes holding different keys never connect; the dialer fails with an
/// authentication error.
fn different_keys_do_not_connect(kind: BackendKind) {
    let mut a = Transport::new(keyed(0, kind)).unwrap();
    let mut c1 = common::cfg(1, kind);
    c1.set("RINGBTL_JOB_KEY", &"ab".repeat(32)).unwrap();
    c1.core.token = TOKEN;
    let mut b = Transport::new(c1).unwrap();
    a.add_peer(PeerId(1), vec![b.local_addr()]).unwrap();
    b.add_peer(PeerId(0), vec![a.local_addr()]).unwrap();
    let fa = failures(&mut a);
    a.send(PeerId(1), Tag(1), &[], 0).unwrap();
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "refusal",
        || !fa.borrow().is_empty(),
    );
    let f = fa.borrow();
    assert!(
        f[0].1.to_string().contains("authentication failed"),
        "{}",
        f[0].1
    );
    assert_eq!(a.stats().auth_failed, 1);
}

/// A transport of job `token` with a key of its own, process 0 of its job, whose dials
/// give up after 2 s.
fn of_job(token: u64, key: &JobKey, kind: BackendKind) -> Transport {
    let mut c = common::cfg(0, kind);
    c.set("RINGBTL_JOB_KEY", &key.to_hex()).unwrap();
    c.core.token = token;
    c.core.connect_timeout = Duration::from_secs(2);
    Transport::new(c).unwrap()
}

/// Two jobs, each of whose process 0 knows the other only by its job's public key and
/// its addresses, and calls it by an id of its own choosing: both dial at once, every
/// message arrives, from the id its receiver chose. A third job that added the first but
/// was not added by it is refused (`UnknownJob`) until its connect timeout; the first job
/// learns nothing from it.
fn two_jobs_talk_with_public_keys_only(kind: BackendKind) {
    const TA: u64 = 0xa1;
    const TB: u64 = 0xb2;
    const TC: u64 = 0xc3;
    let mut a = of_job(TA, &JobKey::generate().unwrap(), kind);
    let mut b = of_job(TB, &JobKey::generate().unwrap(), kind);
    let mut c = of_job(TC, &JobKey::generate().unwrap(), kind);
    assert_ne!(a.job_public_key(), b.job_public_key());
    a.add_job(TB, &b.job_public_key()).unwrap();
    b.add_job(TA, &a.job_public_key()).unwrap();
    c.add_job(TA, &a.job_public_key()).unwrap();
    // A calls B's process 0 "7", B calls A's "3", C calls A's "5".
    a.add_peer_of_job_uris(PeerId(7), TB, PeerId(0), &b.uris())
        .unwrap();
    b.add_peer_of_job_uris(PeerId(3), TA, PeerId(0), &a.uris())
        .unwrap();
    c.add_peer_of_job_uris(PeerId(5), TA, PeerId(0), &a.uris())
        .unwrap();
    let from = |t: &mut Transport| {
        let got = Rc::new(RefCell::new(Vec::new()));
        let g = got.clone();
        t.register(Tag(9), move |_, am| {
            g.borrow_mut().push((am.src, am.payload.to_vec()))
        })
        .unwrap();
        got
    };
    let (ga, gb) = (from(&mut a), from(&mut b));
    let (ca, cb, cc) = (
        completions(&mut a),
        completions(&mut b),
        completions(&mut c),
    );
    for i in 0..20u8 {
        a.send(
            PeerId(7),
            Tag(9),
            &[bytes::Bytes::from(vec![i; 100 + usize::from(i)])],
            u64::from(i),
        )
        .unwrap();
        b.send(
            PeerId(3),
            Tag(9),
            &[bytes::Bytes::from(vec![!i; 3000])],
            u64::from(i),
        )
        .unwrap();
    }
    c.send(
        PeerId(5),
        Tag(9),
        &[bytes::Bytes::from_static(b"stranger")],
        0,
    )
    .unwrap();
    drive(
        &mut [&mut a, &mut b, &mut c],
        Duration::from_secs(20),
        "both jobs' messages and the third job's failure",
        || ca.borrow().len() == 20 && cb.borrow().len() == 20 && cc.borrow().len() == 1,
    );
    assert!(ca
        .borrow()
        .iter()
        .chain(cb.borrow().iter())
        .all(|c| c.result.is_ok()));
    let gb = gb.borrow();
    assert_eq!(gb.len(), 20);
    for (i, (src, p)) in gb.iter().enumerate() {
        assert_eq!((*src, p.len(), p[0]), (PeerId(3), 100 + i, i as u8));
    }
    let ga = ga.borrow();
    assert_eq!(ga.len(), 20);
    for (i, (src, p)) in ga.iter().enumerate() {
        assert_eq!((*src, p.len(), p[0]), (PeerId(7), 3000, !(i as u8)));
    }
    let err = cc.borrow()[0].result.clone().unwrap_err().to_string();
    assert!(err.contains("UnknownJob"), "{err}");
    assert!(a.stats().refused >= 1);
    assert_eq!(a.peer_state(PeerId(5)), None);
    assert_eq!(a.stats().auth_failed + b.stats().auth_failed, 0);
}

backend_tests!(
    forged_hello_is_refused_and_the_real_rank_connects,
    probes_and_rejects_carry_nothing_secret,
    different_keys_do_not_connect,
    two_jobs_talk_with_public_keys_only,
);

#[test]
fn the_key_is_never_displayed() {
    let c = keyed(0, BackendKind::Auto);
    let s = c
        .settings()
        .into_iter()
        .find(|s| s.var == "RINGBTL_JOB_KEY")
        .unwrap();
    assert_eq!(s.value, "<set>");
    assert!(!format!("{c:?}").contains(&KEY_HEX[..16]));
    assert_eq!(c.value("RINGBTL_JOB_KEY").unwrap(), "<set>");
    let mut d = Config::new(PeerId(0));
    let e = d
        .set("RINGBTL_JOB_KEY", &KEY_HEX[1..])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("RINGBTL_JOB_KEY") && !e.contains(&KEY_HEX[1..17]),
        "{e}"
    );
}

#[test]
fn required_refuses_to_start_without_a_key() {
    let mut c = common::cfg(0, BackendKind::Auto);
    c.set("RINGBTL_AUTH", "required").unwrap();
    let mut t = Transport::new(c.clone()).unwrap();
    let e = t
        .add_peer(PeerId(1), vec!["127.0.0.1:9".parse().unwrap()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("RINGBTL_AUTH=required"), "{e}");
    // With a key set later (as from the launcher), it starts.
    let mut t = Transport::new(c.clone()).unwrap();
    t.set_job_key(key());
    t.add_peer(PeerId(1), vec!["127.0.0.1:9".parse().unwrap()])
        .unwrap();
    // A key file that others may read is refused, naming the path and its mode.
    let dir = std::env::temp_dir().join(format!("ringbtl-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("job.key");
    std::fs::write(&path, KEY_HEX).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    c.set("RINGBTL_JOB_KEY_FILE", path.to_str().unwrap())
        .unwrap();
    let e = Transport::new(c.clone()).unwrap_err().to_string();
    assert!(
        e.contains("0640") && e.contains(path.to_str().unwrap()),
        "{e}"
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut t = Transport::new(c).unwrap();
    assert!(t.authenticated());
    t.add_peer(PeerId(1), vec!["127.0.0.1:9".parse().unwrap()])
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
