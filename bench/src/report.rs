//! Statistics (hdrhistogram of round trips) and output: the OSU table, the percentile
//! block and JSON lines.

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;

/// Records round-trip times in nanoseconds.
pub(crate) struct Recorder {
    hist: Histogram<u64>,
    sum_ns: u128,
    min_ns: u64,
    max_ns: u64,
    n: u64,
}

impl Recorder {
    pub(crate) fn new() -> Self {
        Self {
            // 1 ns .. 1 hour, 3 significant digits; allocated once, before the loop.
            hist: Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
                .expect("constant histogram bounds are valid"),
            sum_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
            n: 0,
        }
    }

    #[inline]
    pub(crate) fn record(&mut self, rtt: Duration) {
        let ns = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.hist.saturating_record(ns);
        self.sum_ns += u128::from(ns);
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
        self.n += 1;
    }

    /// One-way statistics (round trip / 2) in microseconds.
    pub(crate) fn finish(&self, warmup: u64) -> Stats {
        if self.n == 0 {
            return Stats {
                iters: 0,
                warmup,
                avg: 0.0,
                min: 0.0,
                max: 0.0,
                p50: 0.0,
                p90: 0.0,
                p99: 0.0,
                p999: 0.0,
            };
        }
        let us = |rtt_ns: f64| rtt_ns / 2000.0;
        // Histogram buckets report their highest equivalent value: clamp to the exact range.
        let q = |p: f64| {
            let v = self
                .hist
                .value_at_quantile(p)
                .clamp(self.min_ns, self.max_ns);
            us(v as f64)
        };
        Stats {
            iters: self.n,
            warmup,
            avg: us(self.sum_ns as f64 / self.n as f64),
            min: us(self.min_ns as f64),
            max: us(self.max_ns as f64),
            p50: q(0.50),
            p90: q(0.90),
            p99: q(0.99),
            p999: q(0.999),
        }
    }
}

/// One-way latency of one series at one size, microseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stats {
    pub(crate) iters: u64,
    pub(crate) warmup: u64,
    pub(crate) avg: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
}

/// What is printed in the header.
pub(crate) struct RunInfo {
    pub(crate) mode: String,
    pub(crate) kernel: String,
    pub(crate) pinned: bool,
    /// `--exchange`: the statistics are of whole exchanges.
    pub(crate) exchange: bool,
    /// `--fresh`: each iteration sent from another slice of an arena.
    pub(crate) fresh: bool,
    /// Labels of the ringbtl series, in run order (empty with `--baseline-only`).
    pub(crate) rings: Vec<String>,
    /// A plain-socket series runs too.
    pub(crate) baseline: bool,
    /// How the baseline sends and receives.
    pub(crate) baseline_how: &'static str,
    /// `--baseline-framed`: each baseline message carries a frame header.
    pub(crate) framed: bool,
    /// The rounds each size's iterations were interleaved in (`--rounds`; 1: none).
    pub(crate) rounds: u64,
}

impl RunInfo {
    fn baseline_only(&self) -> bool {
        self.rings.is_empty()
    }
}

/// One size's results: one entry per ringbtl series, then the baseline if any (latency
/// statistics, or a throughput for bw and rate).
pub(crate) struct Row<S = Stats> {
    pub(crate) size: usize,
    pub(crate) rings: Vec<S>,
    pub(crate) base: Option<S>,
}

/// `a / b`; NaN (printed as `nan`, `null` in JSON) when `b` is not positive.
pub(crate) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

/// The OSU-style table, printed row by row as sizes finish.
pub(crate) struct Table<'a> {
    info: &'a RunInfo,
}

impl<'a> Table<'a> {
    pub(crate) fn new(info: &'a RunInfo) -> Self {
        Self { info }
    }

    pub(crate) fn header(&self, counts: &str) -> String {
        let i = self.info;
        let mut s = String::new();
        s.push_str("# ringbtl Latency Test\n");
        let backend = if i.baseline_only() {
            "none (plain sockets)".to_string()
        } else {
            i.rings.join(", ")
        };
        let pinned = if i.pinned { "cpu0/cpu1" } else { "no" };
        let _ = writeln!(
            s,
            "# backend: {backend}  mode: {}  kernel: {}  pinned: {pinned}",
            i.mode, i.kernel
        );
        let what = if i.exchange {
            "exchange (both ranks send at once, each waits for the other's message): time per exchange"
        } else {
            "one-way latency = round trip / 2"
        };
        let _ = writeln!(s, "# iterations: {counts}; {what}");
        if i.fresh {
            let _ = writeln!(
                s,
                "# fresh buffers: each iteration sends from another slice of a 64 MiB arena"
            );
        }
        if i.rounds > 1 {
            let _ = writeln!(
                s,
                "# interleaved: {} rounds per size, the series in turn; statistics pooled",
                i.rounds
            );
        }
        let pattern = if i.exchange { "exchange" } else { "ping-pong" };
        if i.baseline && !i.baseline_only() {
            let _ = writeln!(
                s,
                "# baseline: plain TCP socket {pattern} ({}), same processes and cores",
                i.baseline_how
            );
        }
        if i.baseline && i.framed {
            let _ = writeln!(
                s,
                "# framed baseline: each plain message is the payload behind an 8-byte \
                 header, ringbtl's frame"
            );
        }
        if i.baseline_only() {
            let _ = writeln!(
                s,
                "# plain TCP socket {pattern} only ({}); a 0-byte message moves 1 byte",
                i.baseline_how
            );
        }
        let _ = write!(s, "{:<10}", "# Size");
        let first = |s: &mut String, h: &str| {
            let _ = write!(s, "{h:>20}");
        };
        match i.rings.as_slice() {
            [] | [_] => first(&mut s, "Latency (us)"),
            [a, rest @ ..] => {
                first(&mut s, &format!("{a} (us)"));
                for b in rest {
                    let _ = write!(s, "{:>14}", format!("{b} (us)"));
                }
                for b in rest {
                    let _ = write!(s, "{:>14}", format!("{b}/{a}"));
                }
            }
        }
        if i.baseline && !i.baseline_only() {
            let _ = write!(s, "{:>15}", "Baseline (us)");
            if i.rings.len() == 1 {
                let _ = write!(s, "{:>10}", "Ratio");
            } else {
                for r in &i.rings {
                    let _ = write!(s, "{:>14}", format!("{r}/base"));
                }
            }
        }
        s
    }

    pub(crate) fn row(&self, row: &Row) -> String {
        let mut s = format!("{:<10}", row.size);
        let stats: Vec<Stats> = if self.info.baseline_only() {
            row.base.iter().copied().collect()
        } else {
            row.rings.clone()
        };
        for (k, st) in stats.iter().enumerate() {
            if k == 0 {
                let _ = write!(s, "{:>20.2}", st.avg);
            } else {
                let _ = write!(s, "{:>14.2}", st.avg);
            }
        }
        if let [a, rest @ ..] = stats.as_slice() {
            for b in rest {
                let _ = write!(s, "{:>14.2}", ratio(b.avg, a.avg));
            }
        }
        if let (Some(b), false) = (row.base, self.info.baseline_only()) {
            let _ = write!(s, "{:>15.2}", b.avg);
            let w = if stats.len() == 1 { 10 } else { 14 };
            for st in &stats {
                let _ = write!(s, "{:>w$.2}", ratio(st.avg, b.avg));
            }
        }
        s
    }

    /// The percentile block printed after the table.
    pub(crate) fn percentiles(&self, rows: &[Row]) -> String {
        let i = self.info;
        let mut s = String::new();
        s.push('\n');
        s.push_str("# One-way latency percentiles (us)");
        let ratio_of = if i.baseline && !i.baseline_only() {
            Some("P50 / baseline P50")
        } else if i.rings.len() > 1 {
            Some("P50 / first backend's P50")
        } else {
            None
        };
        if let Some(r) = ratio_of {
            let _ = write!(s, "; Ratio = {r}");
        }
        s.push('\n');
        let _ = write!(
            s,
            "{:<10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>12}",
            "# Size", "Series", "Iters", "Min", "P50", "P90", "P99", "P99.9", "Max"
        );
        if ratio_of.is_some() {
            let _ = write!(s, "{:>10}", "Ratio");
        }
        s.push('\n');
        for row in rows {
            let mut series: Vec<(&str, Stats, Option<f64>)> = Vec::new();
            for (k, st) in row.rings.iter().enumerate() {
                let r = match (row.base, k) {
                    (Some(b), _) => Some(ratio(st.p50, b.p50)),
                    (None, 0) => None,
                    (None, _) => Some(ratio(st.p50, row.rings[0].p50)),
                };
                series.push((i.rings[k].as_str(), *st, r));
            }
            if let Some(b) = row.base {
                series.push(("socket", b, None));
            }
            for (name, st, r) in series {
                let _ = write!(
                    s,
                    "{:<10}{:>10}{:>10}{:>10.2}{:>10.2}{:>10.2}{:>10.2}{:>10.2}{:>12.2}",
                    row.size, name, st.iters, st.min, st.p50, st.p90, st.p99, st.p999, st.max
                );
                match (r, ratio_of) {
                    (Some(r), _) => {
                        let _ = write!(s, "{r:>10.2}");
                    }
                    (None, Some(_)) => {
                        let _ = write!(s, "{:>10}", "-");
                    }
                    (None, None) => {}
                }
                s.push('\n');
            }
        }
        s
    }
}

/// JSON string literal.
pub(crate) fn json_str(v: &str) -> String {
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\t' => s.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(s, "\\u{:04x}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// JSON number (null for NaN / infinity, which JSON cannot carry).
pub(crate) fn json_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.3}")
    } else {
        "null".into()
    }
}

/// One JSON field: key and value (already JSON text).
pub(crate) type Field = (String, String);

/// What every JSON line of a run says besides one series' own numbers.
pub(crate) struct JsonRun<'a> {
    pub(crate) bench: &'a str,
    pub(crate) mode: &'a str,
    pub(crate) pinned: bool,
    pub(crate) kernel: &'a str,
    /// Labels of the ringbtl series, in run order.
    pub(crate) rings: &'a [String],
    /// Fields of the whole run, after `size` and before the series' own.
    pub(crate) run_fields: Vec<Field>,
}

/// How the results of one series (latency statistics, throughput) read in JSON.
pub(crate) trait JsonSeries {
    /// The series' own fields.
    fn fields(&self) -> Vec<Field>;
    /// The baseline's result `base` folded into this series' object.
    fn vs_baseline(&self, base: &Self) -> Vec<Field>;
    /// The comparison with the first series, labelled `first`.
    fn vs_first(&self, first_series: &Self, first: &str) -> Vec<Field>;
}

/// JSON lines of one size: one object per ringbtl series (the baseline folded in, and
/// from the second series on, the comparison with the first); with no ringbtl series
/// (`--baseline-only`), one object for the socket series.
pub(crate) fn json_lines<S: JsonSeries>(run: &JsonRun<'_>, row: &Row<S>) -> Vec<String> {
    let (size, rings, base) = (row.size, &row.rings, row.base.as_ref());
    let obj = |backend: &str, st: &S, extra: Vec<Field>| {
        let mut kv = vec![
            ("bench".to_string(), json_str(run.bench)),
            ("backend".into(), json_str(backend)),
            ("mode".into(), json_str(run.mode)),
            ("size".into(), size.to_string()),
        ];
        kv.extend(run.run_fields.iter().cloned());
        kv.extend(st.fields());
        kv.push(("pinned".into(), run.pinned.to_string()));
        kv.push(("kernel".into(), json_str(run.kernel)));
        kv.extend(extra);
        let body: Vec<String> = kv
            .iter()
            .map(|(key, val)| format!("{}:{val}", json_str(key)))
            .collect();
        format!("{{{}}}", body.join(","))
    };
    if rings.is_empty() {
        return base.iter().map(|b| obj("socket", b, Vec::new())).collect();
    }
    let mut out = Vec::new();
    for (k, st) in rings.iter().enumerate() {
        let mut extra = Vec::new();
        if let Some(b) = base {
            extra.extend(st.vs_baseline(b));
        }
        if k > 0 {
            extra.extend(st.vs_first(&rings[0], &run.rings[0]));
        }
        out.push(obj(&run.rings[k], st, extra));
    }
    out
}

impl JsonSeries for Stats {
    fn fields(&self) -> Vec<Field> {
        vec![
            ("iters".into(), self.iters.to_string()),
            ("warmup".into(), self.warmup.to_string()),
            ("avg_us".into(), json_num(self.avg)),
            ("min_us".into(), json_num(self.min)),
            ("p50_us".into(), json_num(self.p50)),
            ("p90_us".into(), json_num(self.p90)),
            ("p99_us".into(), json_num(self.p99)),
            ("p999_us".into(), json_num(self.p999)),
            ("max_us".into(), json_num(self.max)),
        ]
    }

    fn vs_baseline(&self, b: &Self) -> Vec<Field> {
        vec![
            ("baseline_avg_us".into(), json_num(b.avg)),
            ("baseline_p50_us".into(), json_num(b.p50)),
            ("baseline_p99_us".into(), json_num(b.p99)),
            ("ratio_avg".into(), json_num(ratio(self.avg, b.avg))),
            ("ratio_p50".into(), json_num(ratio(self.p50, b.p50))),
        ]
    }

    fn vs_first(&self, f: &Self, first: &str) -> Vec<Field> {
        vec![
            (format!("{first}_p50_us"), json_num(f.p50)),
            (
                format!("ratio_p50_vs_{first}"),
                json_num(ratio(self.p50, f.p50)),
            ),
        ]
    }
}

impl RunInfo {
    /// The run as its JSON lines describe it.
    pub(crate) fn json(&self) -> JsonRun<'_> {
        JsonRun {
            bench: if self.exchange { "exchange" } else { "latency" },
            mode: &self.mode,
            pinned: self.pinned,
            kernel: &self.kernel,
            rings: &self.rings,
            run_fields: vec![
                ("rounds".into(), self.rounds.to_string()),
                ("fresh".into(), self.fresh.to_string()),
                ("baseline_framed".into(), self.framed.to_string()),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(avg: f64) -> Stats {
        Stats {
            iters: 10,
            warmup: 1,
            avg,
            min: avg / 2.0,
            max: avg * 3.0,
            p50: avg,
            p90: avg,
            p99: avg * 2.0,
            p999: avg * 2.5,
        }
    }

    fn info(rings: &[&str], baseline: bool) -> RunInfo {
        RunInfo {
            mode: "poll".into(),
            kernel: "6.1\"x".into(),
            pinned: true,
            exchange: false,
            fresh: false,
            rings: rings.iter().map(|s| s.to_string()).collect(),
            baseline,
            baseline_how: "x",
            framed: false,
            rounds: 1,
        }
    }

    #[test]
    fn osu_row_format() {
        let i = info(&["uring"], false);
        let t = Table::new(&i);
        let row = Row {
            size: 8,
            rings: vec![st(3.456)],
            base: None,
        };
        assert_eq!(t.row(&row), format!("{:<10}{:>20.2}", 8, 3.456));
        assert!(t.header("x").ends_with("# Size            Latency (us)"));
    }

    #[test]
    fn columns_align() {
        for (rings, base) in [
            (&["uring"][..], true),
            (&["uring", "epoll"][..], true),
            (&["uring", "epoll"][..], false),
            (&[][..], true),
        ] {
            let i = info(rings, base);
            let t = Table::new(&i);
            let row = Row {
                size: 4194304,
                rings: rings.iter().map(|_| st(1234.5)).collect(),
                base: base.then(|| st(1000.0)),
            };
            let h = t.header("x");
            let last = h.lines().last().unwrap();
            assert_eq!(last.len(), t.row(&row).len(), "{last:?}");
            let p = t.percentiles(std::slice::from_ref(&row));
            let lens: Vec<usize> = p.lines().skip(2).map(str::len).collect();
            assert!(lens.windows(2).all(|w| w[0] == w[1]), "{p}");
        }
    }

    #[test]
    fn json_has_keys() {
        let i = info(&["uring", "epoll"], true);
        let row = Row {
            size: 64,
            rings: vec![st(3.0), st(3.3)],
            base: Some(st(2.0)),
        };
        let lines = json_lines(&i.json(), &row);
        assert_eq!(lines.len(), 2);
        for key in [
            "bench",
            "backend",
            "mode",
            "size",
            "iters",
            "avg_us",
            "p50_us",
            "p99_us",
            "p999_us",
            "max_us",
            "min_us",
            "baseline_p50_us",
            "ratio_p50",
        ] {
            assert!(lines[1].contains(&format!("\"{key}\":")), "{key}");
        }
        assert!(lines[1].contains("\"ratio_p50\":1.650"));
        assert!(lines[1].contains("\"ratio_p50_vs_uring\":1.100"));
        assert!(lines[0].contains("\"kernel\":\"6.1\\\"x\""));
        assert_eq!(json_num(f64::NAN), "null");
    }

    #[test]
    fn recorder_halves_round_trips() {
        let mut r = Recorder::new();
        for us in 1..=100u64 {
            r.record(Duration::from_micros(us * 2));
        }
        let s = r.finish(5);
        assert_eq!(s.iters, 100);
        assert!((s.avg - 50.5).abs() < 1e-9);
        assert!((s.min - 1.0).abs() < 1e-9 && (s.max - 100.0).abs() < 1e-9);
        assert!((s.p50 - 50.0).abs() < 0.1, "{}", s.p50);
        assert!((s.p99 - 99.0).abs() < 0.1, "{}", s.p99);
    }
}
