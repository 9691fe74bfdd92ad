//! Deterministic inputs for running the checks without libFuzzer.
//!
//! [`bytes`] turns a seed into a byte string, which [`arbitrary`] then turns into a typed
//! input exactly as libFuzzer's bytes are. The strings mix lengths from a few bytes to a few
//! kilobytes and bias their bytes towards the values that steer the inputs (small numbers,
//! enum discriminants, frame kinds), so that structured cases are reached without coverage
//! feedback. [`files`] lists saved inputs (kept regressions, a libFuzzer corpus, crash
//! artifacts) to replay.

use std::path::{Path, PathBuf};

/// xorshift64*: small and fast; only determinism matters here.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The input bytes for `seed`.
pub fn bytes(seed: u64) -> Vec<u8> {
    let mut rng = Rng((seed ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xd1b5_4a32_d192_ed03) | 1);
    let len = match rng.next() % 8 {
        0 => rng.next() % 16,
        1..=4 => rng.next() % 256,
        5 | 6 => rng.next() % 2048,
        _ => rng.next() % 8192,
    } as usize;
    (0..len)
        .map(|_| {
            let r = rng.next();
            match r % 4 {
                0 => (r >> 8) as u8 % 4,
                1 => (r >> 8) as u8 % 16,
                _ => (r >> 8) as u8,
            }
        })
        .collect()
}

/// Files under `fuzz/regressions/<target>` (inputs that once failed a check, kept in the
/// repository), `fuzz/corpus/<target>` and `fuzz/artifacts/<target>` (libFuzzer's, not
/// kept), if any.
pub fn files(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in ["regressions", "corpus", "artifacts"] {
        let Ok(rd) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        out.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_file()));
    }
    out.sort();
    out
}
