//! The receiver's order over runs alone: the checks of runs no honest sender writes, and
//! the position, holds and drops through an epoch. (The engine's runs over links, with
//! links lost, are tested through the pair harness, `proto/tests/links.rs`.)

use super::*;

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

#[test]
fn frames_outside_runs_and_a_link_that_becomes_the_first_keep_their_place() {
    let mut o = RunOrder::default();
    // Three frames consumed before the first RUN, one of them counted here.
    o.took_bare();
    o.sync(3);
    o.on_run(2, run(3, 0, 2)).unwrap();
    assert_eq!(o.ready(), Some(2));
    // Link 2 becomes the first (its primary failed): its run goes with it.
    o.moved(2, 0);
    assert_eq!(o.next(2), Take::Frame);
    assert_eq!(o.next(0), Take::Stream(2));
    assert!(o.took(0, 2));
    assert_eq!(o.position(), (0, 5));
}
