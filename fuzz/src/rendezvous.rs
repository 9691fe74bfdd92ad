//! The env + root rendezvous' records from arbitrary bytes, and their MACs.
//!
//! Each case is either arbitrary bytes fed to every decoder (the root's `decode_hello`
//! and `decode_join`, a member's `decode_challenge` and `decode_reply`), or a well-formed
//! record (hello, challenge, join, table) made for one join and then mangled (bytes
//! flipped, cut, or made with another key, token, size, rank or nonce).
//!
//! Properties:
//! - no decoder panics or allocates beyond the record's own length, whatever the bytes;
//! - an untouched record decodes to what was encoded;
//! - a join or a table decodes only with the key, token, size, rank and nonces it was made
//!   for: a mangled or forged one is refused, and the refusal's text carries no byte of
//!   the key;
//! - the root's MAC (challenge) is never accepted as a member's (join): no reflection.

use arbitrary::Arbitrary;
use ringbtl::auth::JobKey;
use ringbtl::wireup::rendezvous::{
    decode_challenge, decode_error, decode_hello, decode_join, decode_reply, encode_challenge,
    encode_hello, encode_join, encode_table, encode_table_body, Nonces,
};

const KEY: [u8; 32] = [0x21; 32];
const TOKEN: u64 = 0xfeed_f00d;

/// One fuzz case.
#[derive(Debug, Arbitrary)]
pub enum Input {
    /// Arbitrary bytes to every decoder, with this job size.
    Raw {
        /// The bytes.
        bytes: Vec<u8>,
        /// Job size the root expects.
        size: u16,
    },
    /// A well-formed record, then mangled.
    Made {
        /// Which record.
        which: Which,
        /// The join's rank (taken modulo the size).
        rank: u16,
        /// Job size.
        size: u16,
        /// Member's and root's nonces (first bytes).
        nonces: (u8, u8),
        /// URI list of the join (or the table's entries).
        uris: Vec<String>,
        /// How it is mangled.
        how: Mangle,
    },
}

/// A record of the rendezvous.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Which {
    /// A member's hello.
    Hello,
    /// The root's challenge.
    Challenge,
    /// A member's join.
    Join,
    /// The root's table.
    Table,
    /// The root's challenge MAC sent back as a join (reflection).
    Reflected,
}

/// What is done to a well-formed record.
#[derive(Debug, Clone, Arbitrary)]
pub enum Mangle {
    /// Nothing.
    None,
    /// These bytes flipped: (offset modulo the length, mask).
    Flip(Vec<(u16, u8)>),
    /// Cut to this length (modulo the length).
    Cut(u16),
    /// Made with another key.
    Key(u8),
    /// Made with another token.
    Token(u64),
    /// Checked against another rank or root nonce than it was made for.
    Replay {
        /// Rank delta.
        rank: u8,
        /// Root nonce byte.
        nonce: u8,
    },
}

fn nonces(rank: u32, (m, r): (u8, u8)) -> Nonces {
    Nonces {
        rank,
        m: [m; 32],
        r: [r; 32],
    }
}

fn no_key_bytes(text: &str) {
    let k = JobKey::from_bytes(KEY).to_hex();
    assert!(!text.contains(&k[..16]), "a refusal shows the key: {text}");
}

/// Runs every check on `input`; panics on a violation.
pub fn run(input: &Input) {
    let key = JobKey::from_bytes(KEY);
    match input {
        Input::Raw { bytes, size } => {
            let size = u32::from(*size);
            let n = nonces(1, (1, 2));
            if let Err(e) = decode_hello(bytes, size) {
                no_key_bytes(&e);
            }
            if let Ok(uris) = decode_join(bytes, &key, TOKEN, size, &n) {
                panic!("arbitrary bytes passed as a join with the key: {uris:?}");
            }
            let _ = decode_challenge(bytes);
            let _ = decode_error(bytes);
            if let Ok(t) = decode_reply(bytes, &key, TOKEN, size, &n) {
                panic!("arbitrary bytes passed as a table with the key: {t:?}");
            }
        }
        Input::Made {
            which,
            rank,
            size,
            nonces: nb,
            uris,
            how,
        } => made(&key, *which, *rank, *size, *nb, uris, how),
    }
}

fn made(
    key: &JobKey,
    which: Which,
    rank: u16,
    size: u16,
    nb: (u8, u8),
    uris: &[String],
    how: &Mangle,
) {
    let size = u32::from(size).max(2);
    let rank = 1 + u32::from(rank) % (size - 1);
    let n = nonces(rank, nb);
    let list: String = uris.join(";").chars().take(512).collect();
    let (mkey, mtoken) = match how {
        Mangle::Key(b) => (JobKey::from_bytes([*b ^ 0x80; 32]), TOKEN),
        Mangle::Token(t) if *t != TOKEN => (key.clone(), *t),
        _ => (key.clone(), TOKEN),
    };
    let table: Vec<String> = (0..size.min(64))
        .map(|i| uris.get(i as usize).cloned().unwrap_or_default())
        .map(|u| u.chars().take(64).collect())
        .collect();
    let mut b = match which {
        Which::Hello => encode_hello(rank, size, &n.m),
        Which::Challenge => encode_challenge(&mkey, mtoken, size, &n),
        Which::Join => encode_join(&mkey, mtoken, size, &n, &list),
        Which::Table => encode_table(&mkey, mtoken, &n, &encode_table_body(&table)),
        Which::Reflected => {
            // The root's MAC where the member's belongs.
            let ch = encode_challenge(&mkey, mtoken, size, &n);
            let mac = &ch[ch.len() - 32..];
            let mut j = encode_join(&mkey, mtoken, size, &n, &list);
            j[7..39].copy_from_slice(mac);
            j
        }
    };
    let original = b.clone();
    let mut check_n = n;
    match how {
        Mangle::Flip(f) => {
            for (at, mask) in f {
                let i = usize::from(*at) % b.len();
                b[i] ^= mask;
            }
        }
        Mangle::Cut(c) => b.truncate(usize::from(*c) % b.len()),
        Mangle::Replay { rank: dr, nonce } => {
            check_n.rank = 1 + (rank - 1 + u32::from(*dr)) % (size - 1);
            check_n.r[0] ^= nonce;
        }
        _ => {}
    }
    let honest = b == original && check_n == n && mkey == *key && mtoken == TOKEN;
    match which {
        Which::Hello => {
            let got = decode_hello(&b, size);
            if b == original {
                assert_eq!(got, Ok((rank, n.m)));
            }
        }
        Which::Challenge => {
            if let Ok((nr, _)) = decode_challenge(&b) {
                if b == original {
                    assert_eq!(nr, n.r);
                }
            }
        }
        Which::Join | Which::Reflected => {
            let got = decode_join(&b, key, TOKEN, size, &check_n);
            match (&got, honest && matches!(which, Which::Join)) {
                (Ok(u), true) => assert_eq!(u, &list),
                (Ok(u), false) => {
                    // A flip may land where nothing is covered only if the bytes are equal.
                    panic!("a mangled or forged join passed: {u:?} ({how:?}, {which:?})")
                }
                (Err(e), true) => panic!("an honest join was refused: {e}"),
                (Err(e), false) => no_key_bytes(e),
            }
        }
        Which::Table => {
            let got = decode_reply(&b, key, TOKEN, table.len() as u32, &check_n);
            match (&got, honest) {
                (Ok(t), true) => assert_eq!(t, &table),
                (Ok(t), false) => panic!("a mangled or forged table passed: {t:?} ({how:?})"),
                (Err(e), true) => panic!("an honest table was refused: {e}"),
                (Err(e), false) => no_key_bytes(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Honest records decode (the checks assert it), mangled ones are refused.
    #[test]
    fn honest_records_pass_and_mangled_ones_do_not() {
        for which in [
            Which::Hello,
            Which::Challenge,
            Which::Join,
            Which::Table,
            Which::Reflected,
        ] {
            for how in [
                Mangle::None,
                Mangle::Flip(vec![(9, 1)]),
                Mangle::Cut(20),
                Mangle::Key(3),
                Mangle::Token(1),
                Mangle::Replay { rank: 1, nonce: 0 },
                Mangle::Replay { rank: 0, nonce: 4 },
            ] {
                run(&Input::Made {
                    which,
                    rank: 2,
                    size: 5,
                    nonces: (7, 9),
                    uris: vec!["tcp://10.0.0.1:5".into(), "tcp://[::1]:6".into()],
                    how,
                });
            }
        }
    }
}
