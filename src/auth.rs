//! The job key: a 32-byte secret shared by the processes of one job, and the MACs that
//! prove its knowledge in the handshake (see [`wire`](crate::wire)) and at the rendezvous.
//!
//! Where the key comes from (no configuration needed under a launcher):
//! - PMIx and PMI-1/PMI-2: rank 0 draws a key and publishes it with its addresses in the
//!   launcher's key-value store, which only the job's processes can read; every other
//!   rank reads it after the exchange's fence ([`Modex::job_key`](crate::wireup::Modex::job_key));
//! - the env + root form: `RINGBTL_JOB_KEY` (64 hex digits) or `RINGBTL_JOB_KEY_FILE` (a
//!   regular file of the user's, mode 0600 or stricter, holding the 64 hex digits).
//!
//! Without a key the handshake runs the same exchange with [`PUBLIC_KEY`], which anyone
//! knows: connections are then unauthenticated, and the transport says so once on stderr
//! (`RINGBTL_AUTH=auto`, the default), keeps quiet (`off`) or refuses to start
//! (`required`).
//!
//! The primitives are HMAC-SHA-256 from the `hmac` and `sha2` crates (verification in
//! constant time), HKDF-SHA-256 (`hkdf`) and X25519 (`x25519-dalek`) for the keys between
//! two jobs ([`pair_key`]), and the operating system's random numbers (`getrandom`). A key is never
//! printed: its `Debug` shows `JobKey(<secret>)`.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Once;

use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use x25519_dalek::{PublicKey, StaticSecret};

use crate::error::Error;
use crate::wire::{PeerId, MAC_LEN, NONCE_LEN, VERSION};

/// Length of a job key in bytes.
pub const KEY_LEN: usize = 32;

/// A job key: 32 secret bytes. Compared in constant time; never printed.
#[derive(Clone)]
pub struct JobKey([u8; KEY_LEN]);

/// The key used when none is configured: public, so it authenticates nothing. The
/// handshake still runs with it, so that there is one code path.
pub const PUBLIC_KEY: JobKey = JobKey(*b"ringbtl unauthenticated job key!");

type HmacSha256 = Hmac<Sha256>;

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_public() {
            f.write_str("JobKey(<public>)")
        } else {
            f.write_str("JobKey(<secret>)")
        }
    }
}

impl PartialEq for JobKey {
    fn eq(&self, other: &Self) -> bool {
        // Constant time: the difference of every byte is folded before the one test.
        self.0
            .iter()
            .zip(other.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

impl Eq for JobKey {}

impl JobKey {
    /// A key of these bytes.
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// A fresh random key from the operating system.
    pub fn generate() -> Result<Self, Error> {
        let mut k = [0u8; KEY_LEN];
        getrandom::fill(&mut k).map_err(|e| Error::Config(format!("drawing a job key: {e}")))?;
        Ok(Self(k))
    }

    /// Parses 64 hexadecimal digits (surrounding white space ignored). The error says
    /// what was expected, never what was given.
    pub fn from_hex(text: &str) -> Result<Self, String> {
        key_from_hex(text).map(Self)
    }

    /// The key as 64 lowercase hexadecimal digits, to hand it to a process of the same
    /// job (a launcher's key-value store, a child's environment). Never log it.
    pub fn to_hex(&self) -> String {
        key_to_hex(&self.0)
    }

    /// Reads a key file: a regular file owned by this user, with no permission for group
    /// or others (mode 0600 or stricter), holding 64 hexadecimal digits. The file is
    /// opened first and its open descriptor checked, so the checked file is the one read.
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let shown = path.display();
        let f = File::open(path)
            .map_err(|e| Error::Config(format!("RINGBTL_JOB_KEY_FILE={shown}: {e}")))?;
        let meta = f
            .metadata()
            .map_err(|e| Error::Config(format!("RINGBTL_JOB_KEY_FILE={shown}: {e}")))?;
        let mode = meta.mode() & 0o7777;
        if !meta.is_file() {
            return Err(Error::Config(format!(
                "RINGBTL_JOB_KEY_FILE={shown}: not a regular file"
            )));
        }
        let me = euid();
        if meta.uid() != me {
            return Err(Error::Config(format!(
                "RINGBTL_JOB_KEY_FILE={shown}: owned by uid {}, not by this user (uid {me}); \
                 a key file must be the user's own",
                meta.uid()
            )));
        }
        if mode & 0o077 != 0 {
            return Err(Error::Config(format!(
                "RINGBTL_JOB_KEY_FILE={shown}: mode {mode:04o} lets group or others in; \
                 the key file must be mode 0600 or stricter (chmod 600 {shown})"
            )));
        }
        let mut text = String::new();
        // 64 digits and some white space: anything much longer is not a key file.
        f.take(256)
            .read_to_string(&mut text)
            .map_err(|e| Error::Config(format!("RINGBTL_JOB_KEY_FILE={shown}: {e}")))?;
        Self::from_hex(&text)
            .map_err(|e| Error::Config(format!("RINGBTL_JOB_KEY_FILE={shown}: {e}")))
    }

    /// The job's public key: the X25519 public key of a secret derived from the job key
    /// (HKDF-SHA-256), the same in every process of the job. Publishing it to another
    /// job (through the launcher) lets the two derive their pair key ([`pair_key`])
    /// without handing over the job key.
    pub fn public(&self) -> [u8; KEY_LEN] {
        PublicKey::from(&self.agreement_secret()).to_bytes()
    }

    fn agreement_secret(&self) -> StaticSecret {
        let mut s = [0u8; KEY_LEN];
        Hkdf::<Sha256>::new(None, &self.0)
            .expand(b"ringbtl job agreement key", &mut s)
            .expect("32 bytes is a valid HKDF-SHA-256 length");
        StaticSecret::from(s)
    }

    /// True for [`PUBLIC_KEY`].
    pub fn is_public(&self) -> bool {
        *self == PUBLIC_KEY
    }

    /// HMAC-SHA-256 of the concatenation of `parts`.
    pub fn mac(&self, parts: &[&[u8]]) -> [u8; MAC_LEN] {
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&self.hmac(parts).finalize().into_bytes());
        out
    }

    /// Verifies `tag` against the HMAC-SHA-256 of `parts`, in constant time.
    pub fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        self.hmac(parts).verify_slice(tag).is_ok()
    }

    fn hmac(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut m =
            <HmacSha256 as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        for p in parts {
            m.update(p);
        }
        m
    }
}

/// This process's effective user id.
#[allow(unsafe_code)]
fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions, touches no memory of ours and cannot fail.
    unsafe { libc::geteuid() }
}

/// Which side of a handshake a MAC proves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The side that accepted the connection (its MAC comes first, in CHALLENGE).
    Acceptor,
    /// The side that dialed (its MAC comes in AUTH).
    Dialer,
}

impl Side {
    /// The label that starts the MAC's input; the labels differ so that a MAC cannot be
    /// reflected to the side that made it.
    fn label(self) -> &'static [u8; 16] {
        match self {
            Side::Acceptor => b"ringbtl acceptor",
            Side::Dialer => b"ringbtl dialer\0\0",
        }
    }
}

/// What a handshake MAC covers: both nonces, both jobs and process ids, the protocol
/// version and the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transcript<'a> {
    /// The dialer's job (its job token, `RINGBTL_JOB_TOKEN`).
    pub job_d: u64,
    /// The acceptor's job (the dialer's, within a job).
    pub job_a: u64,
    /// The dialer's nonce (from HELLO).
    pub nonce_d: &'a [u8; NONCE_LEN],
    /// The acceptor's nonce (from CHALLENGE).
    pub nonce_a: &'a [u8; NONCE_LEN],
    /// The dialer's process id.
    pub pid_d: PeerId,
    /// The acceptor's process id.
    pub pid_a: PeerId,
    /// The link the dial is to be ([`Hello::link`](crate::wire::Hello::link)).
    pub link: u8,
}

impl Transcript<'_> {
    fn with_parts<R>(&self, side: Side, f: impl FnOnce(&[&[u8]]) -> R) -> R {
        f(&[
            side.label(),
            &VERSION.to_be_bytes(),
            &self.job_d.to_be_bytes(),
            &self.job_a.to_be_bytes(),
            self.nonce_d,
            self.nonce_a,
            &self.pid_d.0.to_be_bytes(),
            &self.pid_a.0.to_be_bytes(),
            &[self.link],
        ])
    }
}

/// `HMAC-SHA-256(key, label(side) | version | job_d | job_a | Nd | Na | pid_d | pid_a |
/// link)`.
pub fn handshake_mac(key: &JobKey, side: Side, t: &Transcript<'_>) -> [u8; MAC_LEN] {
    t.with_parts(side, |p| key.mac(p))
}

/// Checks a handshake MAC in constant time.
pub fn verify_handshake(key: &JobKey, side: Side, t: &Transcript<'_>, mac: &[u8]) -> bool {
    t.with_parts(side, |p| key.verify(p, mac))
}

/// 64 hexadecimal digits (surrounding white space ignored) as 32 bytes: a job key's text
/// ([`JobKey::from_hex`]) or a [public key](JobKey::public)'s. The error says what was
/// expected, never what was given.
pub fn key_from_hex(text: &str) -> Result<[u8; KEY_LEN], String> {
    let t = text.trim().as_bytes();
    if t.len() != 2 * KEY_LEN {
        return Err(format!(
            "expected {} hexadecimal digits (a {KEY_LEN}-byte key), got {} characters",
            2 * KEY_LEN,
            t.len()
        ));
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut k = [0u8; KEY_LEN];
    for (i, pair) in t.chunks_exact(2).enumerate() {
        match (digit(pair[0]), digit(pair[1])) {
            (Some(h), Some(l)) => k[i] = h << 4 | l,
            _ => return Err("expected hexadecimal digits only (0-9, a-f)".into()),
        }
    }
    Ok(k)
}

/// 32 bytes as 64 lowercase hexadecimal digits (the text [`key_from_hex`] reads).
pub fn key_to_hex(key: &[u8; KEY_LEN]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key of the connections between two jobs, derived by each from its own job key and
/// the other job's [public key](JobKey::public): HKDF-SHA-256 over their X25519 shared
/// secret, bound to both jobs' tokens (the lower first, so both derive the same key).
/// Without a job key on either side (the [`PUBLIC_KEY`]) the pair key authenticates
/// nothing, as within a job. A public key that is not one (an X25519 point of small
/// order, which makes the shared secret zero) is an error.
pub fn pair_key(
    own: &JobKey,
    own_job: u64,
    their_public: &[u8; KEY_LEN],
    their_job: u64,
) -> Result<JobKey, Error> {
    if own_job == their_job {
        return Err(Error::Config(format!(
            "job {own_job:x} is this process's own job: a pair key joins two different jobs"
        )));
    }
    let shared = own
        .agreement_secret()
        .diffie_hellman(&PublicKey::from(*their_public));
    if !shared.was_contributory() {
        return Err(Error::Config(format!(
            "job {their_job:x}: its public key is not a usable X25519 key"
        )));
    }
    let (lo, hi) = (own_job.min(their_job), own_job.max(their_job));
    let mut info = [0u8; 32];
    info[..16].copy_from_slice(b"ringbtl job pair");
    info[16..24].copy_from_slice(&lo.to_be_bytes());
    info[24..].copy_from_slice(&hi.to_be_bytes());
    let mut k = [0u8; KEY_LEN];
    Hkdf::<Sha256>::new(None, shared.as_bytes())
        .expand(&info, &mut k)
        .expect("32 bytes is a valid HKDF-SHA-256 length");
    Ok(JobKey(k))
}

/// A fresh nonce from the operating system (`None` if it has none to give).
pub fn os_nonce() -> Option<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).ok()?;
    Some(n)
}

/// What to do without a job key (`RINGBTL_AUTH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthMode {
    /// Authenticate when a key is there; without one, say once on stderr that
    /// connections are unauthenticated.
    #[default]
    Auto,
    /// As `Auto`, without the message.
    Off,
    /// Refuse to start without a key.
    Required,
}

impl AuthMode {
    /// What `RINGBTL_AUTH` accepts.
    pub const ACCEPTED: &'static str = "auto, off, required";

    /// The value's name in `RINGBTL_AUTH`.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthMode::Auto => "auto",
            AuthMode::Off => "off",
            AuthMode::Required => "required",
        }
    }

    /// Parses `auto`, `off` or `required`.
    pub fn parse(v: &str) -> Option<Self> {
        match v.trim() {
            "auto" => Some(AuthMode::Auto),
            "off" => Some(AuthMode::Off),
            "required" => Some(AuthMode::Required),
            _ => None,
        }
    }

    /// Applies the mode to the key a process ended up with: `Err` under `required`
    /// without a key; under `auto` without a key, one loud line on stderr (once per
    /// process).
    pub fn check(self, key: Option<&JobKey>) -> Result<(), Error> {
        if key.is_some_and(|k| !k.is_public()) {
            return Ok(());
        }
        match self {
            AuthMode::Required => Err(Error::Config(
                "RINGBTL_AUTH=required but no job key is available: run under a PMIx or PMI \
                 launcher, or set RINGBTL_JOB_KEY (64 hex digits) or RINGBTL_JOB_KEY_FILE \
                 (a file of mode 0600)"
                    .into(),
            )),
            AuthMode::Off => Ok(()),
            AuthMode::Auto => {
                static ONCE: Once = Once::new();
                ONCE.call_once(|| {
                    eprintln!(
                        "ringbtl: WARNING: no job key: connections are UNAUTHENTICATED (any \
                         local process can join this job); set RINGBTL_JOB_KEY or \
                         RINGBTL_JOB_KEY_FILE, or RINGBTL_AUTH=off to silence this"
                    );
                });
                Ok(())
            }
        }
    }
}

impl fmt::Display for AuthMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn hex_round_trip_and_errors_never_echo_the_key() {
        let k = JobKey::from_hex(HEX).unwrap();
        assert_eq!(k.to_hex(), HEX);
        assert_eq!(JobKey::from_hex(&format!(" {HEX}\n")).unwrap(), k);
        let short = JobKey::from_hex(&HEX[..62]).unwrap_err();
        assert!(short.contains("64 hexadecimal digits"), "{short}");
        let bad = format!("zz{}", &HEX[2..]);
        let e = JobKey::from_hex(&bad).unwrap_err();
        assert!(!e.contains(&bad[2..20]), "{e}");
        assert_eq!(format!("{k:?}"), "JobKey(<secret>)");
        assert!(!format!("{k:?}").contains("0001"));
        assert_eq!(format!("{PUBLIC_KEY:?}"), "JobKey(<public>)");
        assert_ne!(JobKey::generate().unwrap(), JobKey::generate().unwrap());
    }

    #[test]
    fn two_jobs_derive_one_pair_key_from_public_keys_alone() {
        let (a, b, c) = (
            JobKey::generate().unwrap(),
            JobKey::generate().unwrap(),
            JobKey::generate().unwrap(),
        );
        // Every process of a job derives the same public key, which is not the job key.
        assert_eq!(a.public(), a.clone().public());
        assert_ne!(a.public(), b.public());
        assert_ne!(JobKey::from_bytes(a.public()), a);
        let ab = pair_key(&a, 7, &b.public(), 9).unwrap();
        assert_eq!(ab, pair_key(&b, 9, &a.public(), 7).unwrap());
        assert!(ab != a && ab != b && !ab.is_public());
        // Another job, or the same two with other tokens, gets another key.
        assert_ne!(ab, pair_key(&c, 9, &a.public(), 7).unwrap());
        assert_ne!(ab, pair_key(&a, 7, &b.public(), 8).unwrap());
        // A key of one job with itself, and a public key of small order, are refused.
        let e = pair_key(&a, 7, &b.public(), 7).unwrap_err().to_string();
        assert!(e.contains("two different jobs"), "{e}");
        let e = pair_key(&a, 7, &[0u8; KEY_LEN], 9).unwrap_err().to_string();
        assert!(e.contains("not a usable X25519 key"), "{e}");
    }

    #[test]
    fn macs_depend_on_side_key_and_every_field() {
        let (nd, na) = ([1u8; NONCE_LEN], [2u8; NONCE_LEN]);
        let t = Transcript {
            job_d: 9,
            job_a: 9,
            nonce_d: &nd,
            nonce_a: &na,
            pid_d: PeerId(1),
            pid_a: PeerId(2),
            link: 0,
        };
        let k = JobKey::from_hex(HEX).unwrap();
        let m = handshake_mac(&k, Side::Acceptor, &t);
        assert!(verify_handshake(&k, Side::Acceptor, &t, &m));
        assert!(!verify_handshake(&k, Side::Dialer, &t, &m));
        assert!(!verify_handshake(&PUBLIC_KEY, Side::Acceptor, &t, &m));
        assert!(!verify_handshake(&k, Side::Acceptor, &t, &m[..31]));
        let other = [3u8; NONCE_LEN];
        for t2 in [
            Transcript { job_d: 8, ..t },
            Transcript { job_a: 8, ..t },
            Transcript {
                nonce_d: &other,
                ..t
            },
            Transcript {
                nonce_a: &other,
                ..t
            },
            Transcript {
                pid_d: PeerId(3),
                ..t
            },
            Transcript {
                pid_a: PeerId(3),
                link: 0,
                ..t
            },
        ] {
            assert!(!verify_handshake(&k, Side::Acceptor, &t2, &m));
        }
    }

    #[test]
    fn key_files_must_be_private_regular_files() {
        let dir = std::env::temp_dir().join(format!("ringbtl-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        std::fs::write(&path, format!("{HEX}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = JobKey::from_file(&path).unwrap_err().to_string();
        assert!(
            e.contains("mode 0644") && e.contains(&path.display().to_string()),
            "{e}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            JobKey::from_file(&path).unwrap(),
            JobKey::from_hex(HEX).unwrap()
        );
        let e = JobKey::from_file(&dir).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let e = JobKey::from_file(&dir.join("absent"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("absent"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn modes() {
        for m in [AuthMode::Auto, AuthMode::Off, AuthMode::Required] {
            assert_eq!(AuthMode::parse(m.as_str()), Some(m));
        }
        assert_eq!(AuthMode::parse("yes"), None);
        let k = JobKey::from_hex(HEX).unwrap();
        assert!(AuthMode::Required.check(Some(&k)).is_ok());
        for none in [None, Some(&PUBLIC_KEY)] {
            let e = AuthMode::Required.check(none).unwrap_err().to_string();
            assert!(e.contains("RINGBTL_AUTH=required"), "{e}");
            assert!(AuthMode::Off.check(none).is_ok());
        }
    }
}
