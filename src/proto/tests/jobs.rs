//! Pair tests: processes of two jobs, each knowing the other's only by its public key,
//! and processes of jobs that were never added.

use super::*;
use crate::error::Cause;

const JOB_A: u64 = 0xa000_0001;
const JOB_B: u64 = 0xb000_0002;

/// Node `i`'s configuration in job `job`, with its own job key.
fn cfg_in(i: u32, job: u64, key: &JobKey) -> CoreConfig {
    CoreConfig {
        token: job,
        job_key: Some(key.clone()),
        ..cfg(i)
    }
}

/// Nodes 0 and 1 of jobs A and B, which know nothing of each other yet.
fn two_jobs(seed: u64, a: &JobKey, b: &JobKey) -> Net {
    Net::with_known(
        seed,
        vec![cfg_in(0, JOB_A, a), cfg_in(1, JOB_B, b)],
        |_, _| false,
    )
}

/// Node `n` adds the other job with the pair key it derives itself, and the other node
/// (whose process id in its job is its index, and which goes by its index here).
fn add_other(net: &mut Net, n: usize, own: &JobKey, their_public: &[u8; 32]) {
    let (own_job, their_job) = if n == 0 {
        (JOB_A, JOB_B)
    } else {
        (JOB_B, JOB_A)
    };
    let other = 1 - n;
    let key = auth::pair_key(own, own_job, their_public, their_job).unwrap();
    let core = net.core(n);
    core.add_job(their_job, key).unwrap();
    let p = PeerId(other as u32);
    core.add_peer_of_job(p, their_job, p, vec![addr(other)], Vec::new())
        .unwrap();
}

/// Two jobs that exchanged public keys only connect, in whichever order they dial
/// (simultaneous connects included), and every message in both directions arrives once,
/// in order; each end sees one connection.
#[test]
fn two_jobs_that_exchanged_public_keys_connect_and_exchange() {
    let (a, b) = (JobKey::generate().unwrap(), JobKey::generate().unwrap());
    for seed in 0..60 {
        let mut net = two_jobs(seed, &a, &b);
        add_other(&mut net, 0, &a, &b.public());
        add_other(&mut net, 1, &b, &a.public());
        for _ in 0..1 + net.rng.below(8) {
            let from = net.rng.below(2);
            net.send_random(from, 1 - from as u32).unwrap();
        }
        net.drive();
        for (from, to) in [(0, 1), (1, 0)] {
            net.assert_all_delivered(from, to);
            assert!(
                net.completions(from).values().all(Result::is_ok),
                "seed {seed}"
            );
            let ups = net.count_events(to, |e| *e == CoreEvent::Connected(PeerId(from as u32)));
            assert_eq!(ups, 1, "seed {seed}: node {to} connected {ups} times");
        }
        assert_eq!(net.core(0).counters().auth_failed, 0, "seed {seed}");
    }
}

/// A job dials a process whose job has not added it yet: refused as `UnknownJob`, it
/// tries again, and connects once the other job added it (the two jobs add each other at
/// about the same time); nothing is lost.
#[test]
fn a_job_not_yet_added_is_refused_then_connects_once_added() {
    let (a, b) = (JobKey::generate().unwrap(), JobKey::generate().unwrap());
    for seed in 0..30 {
        let mut net = two_jobs(seed, &a, &b);
        add_other(&mut net, 1, &b, &a.public());
        for _ in 0..3 {
            net.send_random(1, 0).unwrap();
        }
        net.drive_until(net.now() + Duration::from_secs(5), |n| {
            n.nodes[0].core.counters().refused > 0
        });
        assert!(
            net.core(0).counters().refused > 0,
            "seed {seed}: not refused"
        );
        assert!(net.received(0, 1).is_empty());
        add_other(&mut net, 0, &a, &b.public());
        net.drive();
        net.assert_all_delivered(1, 0);
        assert!(
            net.completions(1).values().all(Result::is_ok),
            "seed {seed}"
        );
    }
}

/// A job never added: the dialer retries until its connect timeout, not counting these
/// refusals against its connect retries; then its endpoint fails naming the refusal,
/// every send fails, and the acceptor learned nothing (no endpoint, no frame).
#[test]
fn a_job_never_added_fails_the_dial_and_delivers_nothing() {
    let (a, b) = (JobKey::generate().unwrap(), JobKey::generate().unwrap());
    for seed in 0..20 {
        let mut net = two_jobs(seed, &a, &b);
        add_other(&mut net, 1, &b, &a.public());
        for _ in 0..3 {
            net.send_random(1, 0).unwrap();
        }
        let t0 = net.now();
        net.drive();
        let took = net.now() - t0;
        let timeout = cfg(1).connect_timeout;
        assert!(
            took >= timeout - Duration::from_secs(1),
            "seed {seed}: gave up after {took:?}"
        );
        assert!(
            net.core(0).counters().refused > 5,
            "seed {seed}: more refusals than retries"
        );
        let failed = net.failed_events(1);
        assert_eq!(failed.len(), 1, "seed {seed}: {failed:?}");
        assert!(
            matches!(
                &failed[0].1,
                FailReason::ConnectFailed {
                    cause: Cause::Refused(RejectReason::UnknownJob),
                    ..
                }
            ),
            "seed {seed}: {failed:?}"
        );
        assert!(net.completions(1).values().all(Result::is_err));
        assert!(net.received(0, 1).is_empty());
        assert_eq!(net.core(0).state(PeerId(1)), None);
        assert!(net.failed_events(0).is_empty());
    }
}

/// A process of a third job that claims to be process 2 of job B, holding the public keys
/// of both A and B but not B's job key, cannot prove the pair key of A and B: its dial
/// fails on A's CHALLENGE and A adopts nothing from it, while the real process 1 of B
/// connects.
#[test]
fn a_third_job_cannot_pass_for_a_process_of_an_added_job() {
    let (a, b, c) = (
        JobKey::generate().unwrap(),
        JobKey::generate().unwrap(),
        JobKey::generate().unwrap(),
    );
    let ab = auth::pair_key(&a, JOB_A, &b.public(), JOB_B).unwrap();
    // The impostor: job C's key, B's name, and the best key it can derive for A.
    let forged = auth::pair_key(&c, JOB_B, &a.public(), JOB_A).unwrap();
    for seed in 0..20 {
        let cfgs = vec![
            cfg_in(0, JOB_A, &a),
            cfg_in(1, JOB_B, &b),
            cfg_in(2, JOB_B, &c),
        ];
        let mut net = Net::with_known(seed, cfgs, |_, _| false);
        net.core(0).add_job(JOB_B, ab.clone()).unwrap();
        for p in [1, 2] {
            let p = PeerId(p);
            let at = vec![addr(p.0 as usize)];
            net.core(0)
                .add_peer_of_job(p, JOB_B, p, at, Vec::new())
                .unwrap();
        }
        for (n, key) in [(1, ab.clone()), (2, forged.clone())] {
            let core = net.core(n);
            core.add_job(JOB_A, key).unwrap();
            core.add_peer_of_job(PeerId(0), JOB_A, PeerId(0), vec![addr(0)], Vec::new())
                .unwrap();
            net.send_random(n, 0).unwrap();
        }
        net.drive();
        assert!(net.core(2).counters().auth_failed > 0, "seed {seed}");
        assert!(net.received(0, 2).is_empty(), "seed {seed}");
        assert!(
            net.completions(2).values().all(Result::is_err),
            "seed {seed}"
        );
        assert_eq!(
            net.count_events(0, |e| *e == CoreEvent::Connected(PeerId(2))),
            0
        );
        net.assert_all_delivered(1, 0);
        assert!(
            net.completions(1).values().all(Result::is_ok),
            "seed {seed}"
        );
    }
}

/// Within a job a process whose token differs is of another job: refused before any
/// proof is asked (no CHALLENGE, so nothing a MAC could be learnt from).
#[test]
fn a_process_of_another_job_gets_no_challenge() {
    for seed in 0..10 {
        let mut net = Net::pair(seed);
        let r = net.raw_dial(0);
        let mut h = Hello::new(HelloKind::Hello, PeerId(1));
        h.job = TOKEN ^ 1;
        h.to = PeerId(0);
        h.nonce = RAW_NONCE;
        net.raw_write(r, &h.to_bytes());
        net.run(false);
        let ans = Hello::parse(&net.raw_read(r)).expect("an answer");
        assert_eq!(ans.kind, HelloKind::Reject(RejectReason::UnknownJob));
        assert_eq!((ans.nonce, ans.mac), ([0; NONCE_LEN], [0; 32]));
        assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Closed));
        assert_eq!(net.core(0).counters().refused, 1);
    }
}

/// The engine refuses what would confuse two processes: its own job as another, a
/// process of a job not added, an id already taken, one process under two ids.
#[test]
fn adding_other_jobs_checks_its_arguments() {
    let mut core = Core::new(cfg(0));
    let e = core
        .add_job(TOKEN, JobKey::generate().unwrap())
        .unwrap_err();
    assert!(e.to_string().contains("own job"), "{e}");
    let a = vec![addr(1)];
    assert!(core
        .add_peer_of_job(PeerId(5), JOB_B, PeerId(0), a.clone(), Vec::new())
        .is_err());
    core.add_job(JOB_B, JobKey::generate().unwrap()).unwrap();
    core.add_peer(PeerId(1), a.clone()).unwrap();
    assert!(core
        .add_peer_of_job(PeerId(1), JOB_B, PeerId(0), a.clone(), Vec::new())
        .is_err());
    core.add_peer_of_job(PeerId(5), JOB_B, PeerId(0), a.clone(), Vec::new())
        .unwrap();
    // Again, same process and id: new addresses only.
    core.add_peer_of_job(PeerId(5), JOB_B, PeerId(0), a.clone(), Vec::new())
        .unwrap();
    assert!(core
        .add_peer_of_job(PeerId(6), JOB_B, PeerId(0), a.clone(), Vec::new())
        .is_err());
    assert!(core
        .add_peer_of_job(PeerId(5), JOB_B, PeerId(1), a, Vec::new())
        .is_err());
}
