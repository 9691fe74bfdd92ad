//! The plain active messages of one read go as a run, their connection checked once
//! (`walk_read`); a delivery that ends a connection stops the run, and the rest of the
//! read is decided as before runs existed: the connection is gone, so nothing more of it
//! is delivered.

use super::*;

/// Frames of tag 7 from the raw peer of `confirmed_raw_peer`, in one write: payloads
/// `[i; 8]` for `i` in `0..n`.
fn burst(n: u8) -> Vec<u8> {
    (0..n)
        .flat_map(|i| frame(FrameKind::Send, 7, &[i; 8]))
        .collect()
}

/// The first payload byte of every message of tag 7 that node 0 got.
fn got7(net: &Net) -> Vec<u8> {
    let got = &net.nodes[0].got;
    got.iter()
        .filter(|(_, t, _)| *t == Tag(7))
        .map(|(_, _, p)| p[0])
        .collect()
}

#[test]
fn a_read_of_plain_messages_is_delivered_whole_and_in_order() {
    let mut net = Net::new(31, vec![cfg(0), cfg(1)]);
    net.knobs.split = false;
    let r = confirmed_raw_peer(&mut net);
    net.raw_write(r, &burst(40));
    net.run(false);
    assert_eq!(got7(&net), (0..40).collect::<Vec<_>>());
    assert!(connected(&net, 0, 1));
}

#[test]
fn a_delivery_that_ends_the_connection_stops_the_run() {
    for end_at in 1..=4usize {
        let mut net = Net::new(32 + end_at as u64, vec![cfg(0), cfg(1)]);
        // One read takes the whole write: the five messages are one run.
        net.knobs.split = false;
        let r = confirmed_raw_peer(&mut net);
        net.knobs.end_at_delivery = Some(end_at);
        net.raw_write(r, &burst(5));
        net.run(false);
        assert_eq!(
            got7(&net),
            (0..end_at as u8).collect::<Vec<_>>(),
            "ended at delivery {end_at}: nothing after it"
        );
        assert!(!connected(&net, 0, 1));
        let failed = net.failed_events(0);
        assert_eq!(failed.len(), 1, "ended at delivery {end_at}: {failed:?}");
        assert_eq!(failed[0].0, PeerId(1));
    }
}
