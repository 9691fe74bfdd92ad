//! Whether lending pages pays on this machine: the send calls' own cost per byte, lent
//! against copied, measured as the backend makes them.
//!
//! A lent payload costs the sender a `send` of its header, a `vmsplice` (its pages into a
//! pipe, by reference) and a `splice` (the pipe into the socket); a copied one a `send`
//! that copies header and payload into the socket. On loopback and towards namespace
//! hosts these calls also run the receiving side's TCP processing, so they compare like
//! with like. Which is cheaper is not a property of the code: on the same VM, with the
//! same kernel, a plain socket's copies ran four times slower on some days than on
//! others, and lending halved an exchange's time in the slow mode and added half to it
//! in the fast one (see docs/design/large-messages.md). So the backend times the calls of
//! every lent pipe-full and of every copying call that moves at least [`SAMPLE_MIN`]
//! bytes, and the transport lends only while lending measures cheaper by a margin.
//!
//! - **Warming up**: until each way has [`WARM`] samples, the judge asks for the way with
//!   fewer, so that a ping-pong's first messages go lent and copied in turn.
//! - **The verdict**: the median of each way's last [`WINDOW`] samples, in time per byte.
//!   Copying, the judge lends once a lent byte costs at most [`LEND_BELOW`] of a copied
//!   one; lending, it copies again once a lent byte costs more than [`COPY_ABOVE`] of
//!   one. The margin stands for what the sender's calls leave out, measured on loopback
//!   where copies were fast (128 KiB ping-pong, `perf trace` of both processes): the
//!   receiver's reads of a lent payload took half as long again as of a copied one (12.5
//!   against 8.5 us: it copies from the sender's memory, not from pages the sender's copy
//!   just wrote), and the peer's ACK costs a call on each side; lending pays only where it
//!   spares the sender about 40 % of a copy. The gap between the two bounds keeps
//!   near-equal costs from flapping.
//! - **Looking again**: the way not chosen is asked for once its newest sample is
//!   [`RECHECK`] older than the newest sample of either, until one sample of it comes;
//!   the rest of the time the chosen way runs alone.
//!
//! One judge per backend (per process), for all its connections.

use std::time::{Duration, Instant};

/// Calls that move fewer bytes are not timed (their cost is mostly the call's own).
pub(crate) const SAMPLE_MIN: usize = 64 * 1024;
/// Samples kept of each way, the newest.
pub(crate) const WINDOW: usize = 5;
/// Samples of each way before the judge gives a verdict.
pub(crate) const WARM: usize = 3;
/// How old the way not chosen may grow before one of its calls is timed again.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);
/// Copying, the judge turns to lending once a lent byte costs at most this share of a
/// copied one, in eighths (see the module documentation).
pub(crate) const LEND_BELOW: Eighths = Eighths(5);
/// Lending, the judge turns to copying once a lent byte costs more than this share of a
/// copied one, in eighths.
pub(crate) const COPY_ABOVE: Eighths = Eighths(6);

/// A share, in eighths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Eighths(pub(crate) u64);

impl Eighths {
    /// `x` times this share.
    pub(crate) fn of(self, x: u64) -> u64 {
        x * self.0 / 8
    }
}

/// The last [`WINDOW`] costs of one call, in picoseconds per byte.
#[derive(Debug, Default, Clone, Copy)]
struct Window {
    ps: [u64; WINDOW],
    /// Samples taken (the window holds the newest `min(n, WINDOW)`).
    n: u64,
}

impl Window {
    fn add(&mut self, ps: u64) {
        self.ps[(self.n % WINDOW as u64) as usize] = ps;
        self.n += 1;
    }

    /// The median of the samples held (0 with none).
    fn median(&self) -> u64 {
        let k = (self.n as usize).min(WINDOW);
        let mut v = self.ps;
        let held = &mut v[..k];
        held.sort_unstable();
        held.get(k / 2).copied().unwrap_or(0)
    }
}

/// What [`LendJudge`] measured, for the transport's statistics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LendCosts {
    /// Median cost of a lent byte (its frame's header `send`, `vmsplice` and `splice`),
    /// picoseconds; 0 unmeasured.
    pub(crate) lend_ps: u64,
    /// Median cost of a copied byte (`send`), picoseconds; 0 unmeasured.
    pub(crate) copy_ps: u64,
    /// Send calls timed, both ways.
    pub(crate) samples: u64,
    /// Lending is the verdict (true until both ways are measured).
    pub(crate) lending: bool,
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub(crate) struct LendJudge {
    lend: Window,
    copy: Window,
    /// The verdict once warm.
    lending: bool,
    /// What [`wanted`](Self::wanted) answers, worked out at each sample (the only time
    /// anything it depends on changes), not at each of the transport's passes.
    want: bool,
    /// When the newest sample of each way was taken.
    lent_at: Option<Instant>,
    copied_at: Option<Instant>,
}

impl Default for LendJudge {
    fn default() -> Self {
        Self {
            lend: Window::default(),
            copy: Window::default(),
            lending: true,
            want: true,
            lent_at: None,
            copied_at: None,
        }
    }
}

/// The cost of `bytes` moved in `took`, picoseconds per byte.
fn per_byte(bytes: usize, took: Duration) -> u64 {
    (took.as_nanos().saturating_mul(1000) / bytes.max(1) as u128) as u64
}

impl LendJudge {
    /// Whether a call moving `bytes` is to be timed.
    #[inline]
    pub(crate) fn times(bytes: usize) -> bool {
        bytes >= SAMPLE_MIN
    }

    /// A pipe-full of `bytes` (at least [`SAMPLE_MIN`]) lent, at `now`, by calls that
    /// took `took` in all (the header's `send`, `vmsplice`, `splice`).
    pub(crate) fn lent(&mut self, bytes: usize, took: Duration, now: Instant) {
        self.lend.add(per_byte(bytes, took));
        self.lent_at = Some(now);
        self.judge(now);
    }

    /// A `send` or `sendmsg` that copied `bytes` into a socket between `t0` and `t1`.
    pub(crate) fn copied(&mut self, bytes: usize, t0: Instant, t1: Instant) {
        self.copy.add(per_byte(bytes, t1 - t0));
        self.copied_at = Some(t1);
        self.judge(t1);
    }

    /// A sample came at `now`: the verdict, then what to ask for: while warming up the
    /// way with fewer samples; after, the verdict, or the way not chosen when its newest
    /// sample is [`RECHECK`] older than `now`.
    fn judge(&mut self, now: Instant) {
        let (lent_n, copied_n) = (self.lend.n, self.copy.n);
        if lent_n < WARM as u64 || copied_n < WARM as u64 {
            self.want = lent_n <= copied_n;
            return;
        }
        let (lend, copy) = (self.lend.median(), self.copy.median());
        self.lending = match self.lending {
            true => lend <= COPY_ABOVE.of(copy),
            false => lend <= LEND_BELOW.of(copy),
        };
        // Both ways have samples once warm.
        let since = |at: Option<Instant>| at.map_or(Duration::ZERO, |t| now.duration_since(t));
        self.want = match self.lending {
            true => since(self.copied_at) < RECHECK,
            false => since(self.lent_at) >= RECHECK,
        };
    }

    /// Whether payloads long enough to lend are to be lent now (see [`judge`](Self::judge)).
    #[inline]
    pub(crate) fn wanted(&self) -> bool {
        self.want
    }

    /// What was measured so far.
    pub(crate) fn costs(&self) -> LendCosts {
        LendCosts {
            lend_ps: self.lend.median(),
            copy_ps: self.copy.median(),
            samples: self.lend.n + self.copy.n,
            lending: self.lending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: usize = 1024;

    /// A judge fed lent and copied payloads of 256 KiB at the given costs (ns per KiB
    /// moved), a millisecond apart from `t`.
    struct Feed {
        j: LendJudge,
        t: Instant,
    }

    impl Feed {
        fn new() -> Self {
            Self {
                j: LendJudge::default(),
                t: Instant::now(),
            }
        }

        fn step(&mut self, gap: Duration) -> Instant {
            self.t += gap;
            self.t
        }

        fn lend(&mut self, ns_per_kib: u64) {
            let len = 256 * KIB;
            let took = Duration::from_nanos(ns_per_kib * (len / KIB) as u64);
            let t0 = self.step(Duration::from_millis(1));
            self.t = t0 + took;
            self.j.lent(len, took, self.t);
        }

        fn copy(&mut self, ns_per_kib: u64) {
            let len = 256 * KIB;
            let t0 = self.step(Duration::from_millis(1));
            let t1 = t0 + Duration::from_nanos(ns_per_kib * (len / KIB) as u64);
            self.j.copied(len, t0, t1);
            self.t = t1;
        }

        /// Feeds what the judge asks for, `n` times, at these costs.
        fn run(&mut self, n: usize, lend_ns: u64, copy_ns: u64) -> (usize, usize) {
            let (mut lent, mut copied) = (0, 0);
            for _ in 0..n {
                if self.j.wanted() {
                    self.lend(lend_ns);
                    lent += 1;
                } else {
                    self.copy(copy_ns);
                    copied += 1;
                }
            }
            (lent, copied)
        }
    }

    #[test]
    fn small_calls_are_not_timed() {
        assert!(!LendJudge::times(SAMPLE_MIN - 1));
        assert!(LendJudge::times(SAMPLE_MIN));
    }

    #[test]
    fn unmeasured_it_lends_and_warms_up_by_turns() {
        let mut f = Feed::new();
        assert!(
            f.j.wanted(),
            "no sample yet: lending, as before any measure"
        );
        assert_eq!(
            f.j.costs(),
            LendCosts {
                lending: true,
                ..LendCosts::default()
            }
        );
        // Warm-up alternates: lent, copied, lent, copied, ...
        let mut seq = Vec::new();
        for _ in 0..2 * WARM {
            let w = f.j.wanted();
            seq.push(w);
            if w {
                f.lend(100);
            } else {
                f.copy(100);
            }
        }
        assert_eq!(seq, [true, false, true, false, true, false]);
    }

    #[test]
    fn copies_where_lending_costs_more_and_lends_where_it_costs_less() {
        // The fast-copy machine: a lent byte costs 1.6x a copied one.
        let mut f = Feed::new();
        let (lent, copied) = f.run(40, 160, 100);
        assert_eq!(
            (lent, copied),
            (WARM, 40 - WARM),
            "after the warm-up, copies"
        );
        let c = f.j.costs();
        assert!(!c.lending && !f.j.wanted(), "{c:?}");
        // 160 and 100 ns per KiB, in picoseconds per byte (truncated per call).
        assert!((150..=157).contains(&c.lend_ps), "{c:?}");
        assert!((95..=98).contains(&c.copy_ps), "{c:?}");
        // The slow-copy machine: a copied byte costs 3x a lent one.
        let mut f = Feed::new();
        let (lent, copied) = f.run(40, 100, 300);
        assert_eq!(
            (lent, copied),
            (40 - WARM, WARM),
            "after the warm-up, lends"
        );
        assert!(f.j.costs().lending && f.j.wanted());
    }

    #[test]
    fn a_slow_outlier_does_not_turn_the_verdict() {
        let mut f = Feed::new();
        f.run(10, 160, 100);
        assert!(!f.j.costs().lending);
        // One copy preempted for a long time: the median holds.
        f.copy(10_000);
        assert!(!f.j.costs().lending && !f.j.wanted());
    }

    #[test]
    fn near_equal_costs_do_not_flap() {
        // Copying; lending 30 % cheaper is within the margin: stays copying.
        let mut f = Feed::new();
        f.run(10, 160, 100);
        for _ in 0..WINDOW {
            f.lend(70);
            f.copy(100);
        }
        assert!(!f.j.costs().lending, "{:?}", f.j.costs());
        // 40 % cheaper: lends; and keeps lending at 30 %...
        for _ in 0..WINDOW {
            f.lend(60);
            f.copy(100);
        }
        assert!(f.j.costs().lending);
        for _ in 0..WINDOW {
            f.lend(70);
            f.copy(100);
        }
        assert!(f.j.costs().lending, "30 % cheaper, lending: keeps lending");
        // ...until less than a quarter cheaper.
        for _ in 0..WINDOW {
            f.lend(80);
            f.copy(100);
        }
        assert!(!f.j.costs().lending);
    }

    #[test]
    fn the_way_not_chosen_is_timed_again_after_a_second() {
        let mut f = Feed::new();
        f.run(10, 160, 100);
        assert!(!f.j.wanted());
        // Copies go on for almost a second: no lent probe.
        let until = f.t + RECHECK - Duration::from_millis(5);
        while f.t < until {
            assert!(!f.j.wanted());
            f.copy(100);
        }
        // A second after the last lent sample: one lent payload is asked for...
        f.step(Duration::from_millis(10));
        f.copy(100);
        assert!(
            f.j.wanted(),
            "the lent way is a second old: asked for again"
        );
        // ...and once it came (still dearer), copies again.
        f.lend(160);
        assert!(!f.j.wanted());
        // The machine changed: lending is now the cheaper; the probes, one a second,
        // bring it back once the median moved.
        let mut lent_probes = 0;
        for _ in 0..(WARM + 1) * 1100 {
            if f.j.wanted() {
                f.lend(50);
                lent_probes += 1;
                if f.j.costs().lending {
                    break;
                }
            } else {
                f.copy(100);
            }
        }
        assert!(f.j.costs().lending, "{:?}", f.j.costs());
        assert_eq!(
            lent_probes,
            WINDOW / 2 + 1,
            "a median of {WINDOW} turns after 3"
        );
    }
}
