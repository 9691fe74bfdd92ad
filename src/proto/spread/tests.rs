//! The two sides of runs alone, and together in a model of links: frames placed by a
//! [`Spreader`], read by a [`RunOrder`] from links taken at random, in random cuts, with
//! links lost (their bytes gone) and RESUMEs reaching the sender late or not at all.
//! Every frame arrives once, in order, bytes checked.

use std::collections::VecDeque;

use super::*;
use crate::proto::tests::Rng;
use crate::wire::{FrameKind, Header, ResumeFrame, HEADER_LEN};

fn load(queued: u64, rate: u64) -> LinkLoad {
    LinkLoad { queued, rate }
}

/// The pieces' runs follow each other from `from`, and their lengths add up to `len`.
fn check_contiguous(pieces: &[Piece], from: u64, len: u64) {
    let mut at = from;
    for p in pieces {
        assert_eq!(p.run.offset, at, "{pieces:?}");
        at += u64::from(p.run.len);
    }
    assert_eq!(at - from, len, "{pieces:?}");
}

#[test]
fn a_message_up_to_the_threshold_goes_whole_on_the_least_queued_link() {
    let mut s = Spreader::new(4096, 1024);
    let mut loads = [load(100, 5), load(10, 1), load(50, 9)];
    let mut out = Vec::new();
    s.place(4096, &mut loads, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].link, 1);
    assert_eq!(loads[1].queued, 10 + 4096);
    // Link 2 (50) is the least queued now.
    s.place(8, &mut loads, &mut out);
    assert_eq!(out[1].link, 2);
    check_contiguous(&out, 0, 4104);
    assert_eq!(s.position(), (0, 4104));
}

#[test]
fn a_longer_message_is_cut_so_that_the_links_empty_together() {
    let mut s = Spreader::new(4096, 1024);
    let mut loads = [load(0, 3_000_000), load(0, 1_000_000)];
    let mut out = Vec::new();
    s.place(1 << 20, &mut loads, &mut out);
    assert_eq!(out.len(), 2, "{out:?}");
    check_contiguous(&out, 0, 1 << 20);
    let (a, b) = (u64::from(out[0].run.len), u64::from(out[1].run.len));
    assert_eq!((out[0].link, out[1].link), (0, 1));
    assert!(a.abs_diff(3 * b) < 8, "{a} vs {b}");
    // A link whose queue alone lasts longer than the message takes none of it.
    let mut loads = [load(1 << 20, 1), load(0, 1)];
    out.clear();
    s.place(1 << 20, &mut loads, &mut out);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].link, 1, "{out:?}");
    check_contiguous(&out, 1 << 20, 1 << 20);
    // Queues of 0 and 10000 at one rate: 30000 bytes make both empty at 20000, the
    // earliest bytes on the link that empties first.
    let mut loads = [load(10_000, 7), load(0, 7)];
    out.clear();
    s.place(30_000, &mut loads, &mut out);
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!((out[0].link, out[0].run.len), (1, 20_000), "{out:?}");
    assert_eq!((out[1].link, out[1].run.len), (0, 10_000), "{out:?}");
    assert_eq!(loads[0].queued, loads[1].queued);
}

#[test]
fn an_idle_link_gets_a_share_and_a_small_one_is_folded() {
    let mut s = Spreader::new(0, 1);
    let mut loads = [load(0, 1 << 30), load(0, 0)];
    let mut out = Vec::new();
    s.place(1 << 20, &mut loads, &mut out);
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(out.iter().any(|p| p.link == 1 && p.run.len > 0));
    // Two even shares of 50 below a minimum of 64: one run of 100.
    let mut s = Spreader::new(0, 64);
    let mut loads = [load(0, 1), load(0, 1)];
    out.clear();
    s.place(100, &mut loads, &mut out);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].run.len, 100);
    // Three parts of 100 under a minimum of 120: one run.
    let mut loads = [load(0, 1), load(0, 1), load(0, 1)];
    let mut s = Spreader::new(0, 120);
    out.clear();
    s.place(300, &mut loads, &mut out);
    check_contiguous(&out, 0, 300);
    assert!(out.iter().all(|p| p.run.len >= 120), "{out:?}");
}

#[test]
fn one_link_takes_everything_in_runs_of_at_most_u32_max() {
    let mut s = Spreader::new(0, 1);
    let mut loads = [load(0, 0)];
    let mut out = Vec::new();
    s.place(3 << 31, &mut loads, &mut out);
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(out.iter().all(|p| p.link == 0));
    check_contiguous(&out, 0, 3 << 31);
    s.new_epoch(4);
    out.clear();
    s.place(10, &mut loads, &mut out);
    assert_eq!(
        out[0].run,
        RunFrame {
            offset: 0,
            epoch: 4,
            len: 10
        }
    );
    out.clear();
    s.place(0, &mut loads, &mut out);
    s.place(10, &mut [], &mut out);
    assert!(out.is_empty());
}

fn run(offset: u64, epoch: u32, len: u32) -> RunFrame {
    RunFrame { offset, epoch, len }
}

#[test]
fn runs_no_honest_sender_writes_are_refused() {
    let bad = Err(ProtoError::RunOutOfOrder);
    let mut o = RunOrder::default();
    assert_eq!(o.on_run(0, run(0, 1, 5)), bad, "a newer epoch");
    assert_eq!(o.on_run(0, run(0, 0, 0)), bad, "no byte");
    assert_eq!(o.on_run(MAX_LINKS, run(0, 0, 5)), bad, "no such link");
    assert_eq!(o.on_run(0, run(u64::MAX, 0, 5)), bad, "past the end");
    o.on_run(0, run(0, 0, 10)).unwrap();
    assert_eq!(o.on_run(0, run(10, 0, 5)), bad, "a run inside a run");
    assert_eq!(o.on_run(1, run(5, 0, 10)), bad, "overlapping");
    assert_eq!(o.on_run(1, run(0, 0, 1)), bad, "overlapping at the start");
    o.on_run(1, run(10, 0, 10)).unwrap();
    assert!(o.took(0, 10));
    assert_eq!(o.on_run(0, run(5, 0, 1)), bad, "before the position");
    assert_eq!(o.position(), (0, 10));
}

#[test]
fn a_later_run_waits_for_the_position_and_an_older_epoch_is_dropped() {
    let mut o = RunOrder::default();
    o.on_run(1, run(7, 0, 3)).unwrap();
    assert_eq!(o.next(1), Take::Hold);
    assert_eq!(o.ready(), None);
    assert_eq!(o.next(0), Take::Frame);
    o.on_run(0, run(0, 0, 7)).unwrap();
    assert_eq!(o.ready(), Some(0));
    assert_eq!(o.next(0), Take::Stream(7));
    assert!(o.took(0, 4));
    assert_eq!(o.next(0), Take::Stream(3));
    assert!(o.took(0, 3));
    assert_eq!(o.next(0), Take::Frame);
    assert_eq!(o.ready(), Some(1));
    assert_eq!(o.next(1), Take::Stream(3));
    assert!(o.took(1, 1));
    // A RESUME: what is left of the run, and a later one of the old epoch, are dropped.
    assert_eq!(o.start_epoch(), Some(1));
    assert_eq!(o.next(1), Take::Drop(2));
    assert!(!o.took(1, 2));
    o.on_run(1, run(50, 0, 4)).unwrap();
    assert_eq!(o.next(1), Take::Drop(4));
    assert!(!o.took(1, 4));
    o.on_run(0, run(0, 1, 2)).unwrap();
    assert_eq!(o.next(0), Take::Stream(2));
    o.link_lost(0);
    assert_eq!(o.next(0), Take::Frame);
    assert_eq!(o.position(), (1, 0));
}

/// Frame `i` of the model's stream: its length (u32), `i` (u32), then bytes that follow
/// from `i`.
fn frame(i: u32, len: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(&(len as u32).to_be_bytes());
    f.extend_from_slice(&i.to_be_bytes());
    f.extend((8..len).map(|j| (i as usize * 31 + j) as u8));
    f
}

/// One link of the model: the bytes on its way to the receiver (`None`: lost), how
/// eagerly the receiver reads it, and the sender's view of it.
struct ModelLink {
    wire: Option<VecDeque<u8>>,
    speed: usize,
    /// The sender places on it.
    used: bool,
    /// Steps until the sender learns it was lost (when it is).
    learns_in: Option<usize>,
    /// Steps until a new connection takes its place (when it is lost).
    back_in: Option<usize>,
}

/// Steps without the position moving after which a stream owed bytes starts a new
/// epoch.
const STALL: usize = 2000;

/// What one model run saw.
#[derive(Default)]
struct Seen {
    cut: usize,
    held: usize,
    dropped: u64,
    failovers: usize,
    lost_resumes: usize,
    stale_resumes: usize,
    asked: usize,
    stalls: usize,
}

/// Frames of random lengths (some above the threshold) spread over `nlinks` links and
/// read at random; `failovers` links lost at random moments. Every frame arrives once,
/// in order, its bytes checked; afterwards the links hold nothing of the current epoch,
/// and without failover every link carried some of the stream.
fn model(seed: u64, nlinks: usize, failovers: usize, seen: &mut Seen) {
    let mut rng = Rng::new(seed);
    let nframes = 60 + rng.below(80);
    let big = if rng.chance(1, 2) { 12_000 } else { 2000 };
    let frames: Vec<Vec<u8>> = (0..nframes)
        .map(|i| frame(i as u32, 8 + rng.below(big)))
        .collect();
    let mut links: Vec<ModelLink> = (0..nlinks)
        .map(|_| ModelLink {
            wire: Some(VecDeque::new()),
            speed: 1 + rng.below(4),
            used: true,
            learns_in: None,
            back_in: None,
        })
        .collect();
    let mut spreader = Spreader::new(512 + rng.below(2048) as u64, 256);
    let mut order = RunOrder::default();
    let mut next_frame = 0usize;
    // RESUMEs on their way to the sender (steps left, count, epoch), in any order (the
    // sender's asking RESUMEs go on the links, behind the runs).
    let mut resumes: Vec<(usize, usize, u32)> = Vec::new();
    // Steps since the stream's position last moved.
    let mut idle = 0usize;
    let mut failovers_left = failovers;
    let mut delivered = 0usize;
    // Stream bytes consumed from each link, lost links' included.
    let mut moved = vec![0u64; nlinks];
    let mut partial: Vec<u8> = Vec::new();
    let mut pieces = Vec::new();
    let mut idx = Vec::new();
    let window = 32 * 1024 * nlinks;
    for step in 0..2_000_000usize {
        // The sender: RESUMEs that arrived (an older one than the last it took is
        // ignored), links it learns were lost (it asks for a RESUME) or came back.
        let mut i = 0;
        while i < resumes.len() {
            if resumes[i].0 > 0 {
                resumes[i].0 -= 1;
                i += 1;
                continue;
            }
            let (_, count, epoch) = resumes.swap_remove(i);
            if epoch > spreader.position().0 {
                spreader.new_epoch(epoch);
                next_frame = count;
            } else {
                seen.stale_resumes += 1;
            }
        }
        let mut ask = false;
        for (i, l) in links.iter_mut().enumerate() {
            if let Some(n) = l.learns_in.as_mut() {
                if *n == 0 {
                    l.used = false;
                    l.learns_in = None;
                    ask = true;
                } else {
                    *n -= 1;
                }
            }
            if let Some(n) = l.back_in.as_mut() {
                if *n == 0 && !l.used && l.learns_in.is_none() {
                    // A new connection: its reading starts between runs.
                    order.link_lost(i);
                    l.wire = Some(VecDeque::new());
                    l.used = true;
                    l.back_in = None;
                } else {
                    *n = n.saturating_sub(1);
                }
            }
        }
        if ask {
            // On a link the sender uses (gone with it, when that one was lost too).
            let used: Vec<usize> = (0..nlinks).filter(|&i| links[i].used).collect();
            let i = used[rng.below(used.len())];
            let asking = ResumeFrame {
                count: 0,
                epoch: 0,
                asks: true,
            };
            if let Some(w) = links[i].wire.as_mut() {
                w.extend(asking.to_bytes());
            }
        }
        // The sender places frames while the links hold less than a window.
        let queued: usize = links
            .iter()
            .filter_map(|l| l.wire.as_ref())
            .map(VecDeque::len)
            .sum();
        if next_frame < nframes && queued < window && rng.chance(1, 2) {
            idx.clear();
            idx.extend((0..nlinks).filter(|&i| links[i].used));
            let mut loads: Vec<LinkLoad> = idx
                .iter()
                .map(|&i| LinkLoad {
                    queued: links[i].wire.as_ref().map_or(0, |w| w.len() as u64),
                    rate: links[i].speed as u64 * 1000,
                })
                .collect();
            let f = &frames[next_frame];
            pieces.clear();
            let (_, start) = spreader.position();
            spreader.place(f.len() as u64, &mut loads, &mut pieces);
            if pieces.len() > 1 {
                seen.cut += 1;
            }
            for p in &pieces {
                let at = (p.run.offset - start) as usize;
                let bytes = &f[at..at + p.run.len as usize];
                if let Some(w) = links[idx[p.link]].wire.as_mut() {
                    w.extend(p.run.to_bytes());
                    w.extend(bytes);
                }
            }
            next_frame += 1;
        }
        // A link lost: its bytes are gone; the receiver starts an epoch and RESUMEs.
        let alive = links.iter().filter(|l| l.wire.is_some()).count();
        if failovers_left > 0 && alive > 1 && rng.chance(1, 400) {
            let i = loop {
                let i = rng.below(nlinks);
                if links[i].wire.is_some() {
                    break i;
                }
            };
            failovers_left -= 1;
            seen.failovers += 1;
            links[i].wire = None;
            links[i].learns_in = Some(rng.below(50));
            // Some come back as new connections, some never.
            links[i].back_in = rng.chance(2, 3).then(|| rng.below(2000));
            // The receiver may see the loss at once (and forget the link's reading), or
            // only through the sender, or its own stall deadline (a run announced on the
            // link, its bytes never coming).
            if rng.chance(1, 2) {
                order.link_lost(i);
                partial.clear();
                let epoch = order.start_epoch().unwrap();
                if !resumes.is_empty() && rng.chance(1, 2) {
                    // The earlier RESUME went with a link too: only this one arrives.
                    resumes.clear();
                    seen.lost_resumes += 1;
                }
                resumes.push((rng.below(60), delivered, epoch));
            }
        }
        // The frame-stall deadline: a stream owed bytes whose position stays that long
        // starts a new epoch.
        idle += 1;
        if idle > STALL && order.waiting() {
            idle = 0;
            partial.clear();
            let epoch = order.start_epoch().unwrap();
            resumes.push((rng.below(60), delivered, epoch));
            seen.stalls += 1;
        }
        // The receiver reads a link, picked by speed.
        let total: usize = links
            .iter()
            .filter(|l| l.wire.is_some())
            .map(|l| l.speed)
            .sum();
        let mut pick = rng.below(total.max(1));
        let Some(i) = (0..nlinks).find(|&i| {
            let l = &links[i];
            if l.wire.is_none() {
                return false;
            }
            if pick < l.speed {
                return true;
            }
            pick -= l.speed;
            false
        }) else {
            continue;
        };
        let most = if rng.chance(1, 4) { 64 } else { 8192 };
        let chunk = 1 + rng.below(most);
        let w = links[i].wire.as_mut().unwrap();
        if w.is_empty() {
            let done = delivered == nframes
                && next_frame == nframes
                && resumes.is_empty()
                && links
                    .iter()
                    .all(|l| l.wire.as_ref().is_none_or(VecDeque::is_empty));
            if done {
                assert_eq!(order.ready(), None, "seed {seed}: a run left unread");
                if failovers == 0 {
                    assert!(
                        moved.iter().all(|&m| m > 0),
                        "seed {seed}: a link idle: {moved:?}"
                    );
                }
                return;
            }
            continue;
        }
        match order.next(i) {
            Take::Frame => {
                let h = Header::parse(&w.iter().take(HEADER_LEN).copied().collect::<Vec<_>>(), 0)
                    .unwrap();
                let b: Vec<u8> = w.drain(..HEADER_LEN + h.len as usize).collect();
                if h.kind == FrameKind::Resume {
                    // The sender asks: a new epoch, answered.
                    assert!(ResumeFrame::parse(&b[HEADER_LEN..]).unwrap().asks);
                    partial.clear();
                    let epoch = order.start_epoch().unwrap();
                    resumes.push((rng.below(60), delivered, epoch));
                    seen.asked += 1;
                    continue;
                }
                let r = RunFrame::parse(&b[HEADER_LEN..]).unwrap();
                order
                    .on_run(i, r)
                    .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e} {r:?}"));
            }
            Take::Hold => seen.held += 1,
            Take::Drop(n) => {
                let k = chunk.min(n as usize).min(w.len());
                w.drain(..k);
                seen.dropped += k as u64;
                assert!(!order.took(i, k as u32));
            }
            Take::Stream(n) => {
                idle = 0;
                let k = chunk.min(n as usize).min(w.len());
                partial.extend(w.drain(..k));
                moved[i] += k as u64;
                assert!(order.took(i, k as u32) || k == 0);
                while partial.len() >= 4 {
                    let len = u32::from_be_bytes(partial[..4].try_into().unwrap()) as usize;
                    if partial.len() < len {
                        break;
                    }
                    assert!(
                        delivered < nframes,
                        "seed {seed}: a frame beyond the stream"
                    );
                    assert_eq!(
                        &partial[..len],
                        &frames[delivered][..],
                        "seed {seed} step {step}: frame {delivered}"
                    );
                    partial.drain(..len);
                    delivered += 1;
                }
            }
        }
    }
    panic!("seed {seed}: stalled, {delivered} of {nframes} frames delivered");
}

#[test]
fn a_stream_spread_over_links_arrives_once_in_order() {
    let mut seen = Seen::default();
    for seed in 0..200 {
        model(seed, 2 + (seed as usize % 3), 0, &mut seen);
    }
    assert!(seen.cut > 100, "cut messages: {}", seen.cut);
    assert!(seen.held > 100, "held reads: {}", seen.held);
}

#[test]
fn links_lost_with_runs_in_flight_lose_and_repeat_nothing() {
    let mut seen = Seen::default();
    for seed in 0..200 {
        model(
            1000 + seed,
            2 + (seed as usize % 3),
            1 + (seed as usize % 3),
            &mut seen,
        );
    }
    assert!(seen.failovers > 200, "failovers: {}", seen.failovers);
    assert!(seen.dropped > 0, "nothing of an older epoch was dropped");
    assert!(seen.lost_resumes > 0, "no RESUME was lost");
    assert!(seen.stale_resumes > 0, "no RESUME came after a newer one");
    assert!(seen.asked > 0, "no asking RESUME was read");
    assert!(seen.stalls > 0, "no stream waited past the deadline");
}
