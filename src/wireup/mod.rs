//! Wire-up: finding this rank's addresses and learning every peer's.
//!
//! A job's ranks must agree on who is who and where each one listens before the first
//! connection. This layer runs once, at start-up, and may block and make system calls;
//! it knows nothing of the [`Transport`](crate::Transport), which consumes its results:
//!
//! 1. [`ifaces`]: list the host's interfaces and select the usable ones
//!    (`RINGBTL_IF_INCLUDE` / `RINGBTL_IF_EXCLUDE`, by name or subnet);
//! 2. [`uri`]: publish the listen addresses as a `tcp://…;tcp://[…]:…` list;
//! 3. [`Modex`]: exchange those lists so every rank holds the table rank → URI list,
//!    through PMIx ([`pmix`], the system's library opened at run time), PMI-1
//!    ([`pmi`]), the env + root rendezvous ([`rendezvous`]) or, for a single process,
//!    nothing at all; [`env`](mod@env) reads the rank and size a launcher
//!    exported;
//! 4. [`route`]: for each peer, the order in which to try its addresses and the local
//!    address to bind each connecting socket to.
//!
//! [`Wireup::from_env`] picks the exchange the way HPC launchers expect:
//! `RINGBTL_WIREUP=pmix|pmi|env|local` forces one; otherwise PMIx when the launcher's
//! PMIx server announced itself (`PMIX_NAMESPACE` / `PMIX_RANK`: Open MPI's `mpirun`,
//! `srun --mpi=pmix`), else PMI-1 when `PMI_FD` is set (MPICH `mpiexec.hydra`,
//! `srun --mpi=pmi2`, Flux), else the rendezvous when `RINGBTL_ROOT` is set, else a single
//! local process. No build option is involved: PMIx's client library is opened when PMIx
//! is chosen, and a launcher that offers PMIx on a machine without the library gets an
//! error that says so (and how to choose another exchange). Every exchange gives up after
//! `RINGBTL_WIREUP_TIMEOUT_MS` milliseconds (default 60 000).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::str::FromStr;
use std::time::Duration;

use crate::auth::JobKey;
use crate::error::Error;
use crate::param::Params;
use crate::proto::config::CoreConfig;

pub mod config;
pub mod env;
pub mod ifaces;
pub mod pmi;
pub mod pmix;
mod probe;
pub mod rendezvous;
pub mod route;
pub mod uri;

pub use config::WireupConfig;
pub use env::RankInfo;
pub use ifaces::{discover, select_local, Cidr, IfFlags, IfMatch, IfSelection, Interface};
pub use pmi::{PmiClient, PmiMaxes};
pub use probe::probe;
pub use rendezvous::Rendezvous;
pub use route::{link_plan, order_peer_addrs, Route};
pub use uri::{format_uri, format_uri_list, parse_uri, parse_uri_list};

/// Time allowed for the address exchange unless `RINGBTL_WIREUP_TIMEOUT_MS` says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// An address exchange ("modex", as MPI runtimes call it): every rank contributes its URI
/// list and gets everybody's.
pub trait Modex {
    /// Publishes `my_uris` and returns the lists of all ranks, indexed by rank (this
    /// rank's own included). Collective: every rank of the job must call it.
    fn exchange(&mut self, my_uris: &str) -> Result<Vec<String>, Error>;

    /// This process's rank.
    fn rank(&self) -> u32;

    /// Number of ranks in the job.
    fn size(&self) -> u32;

    /// The job key the launcher's key-value store handed out during the exchange (rank 0
    /// draws it and publishes it with its addresses; the others read it after the
    /// fence), or the one the env + root form was configured with. `None` before the
    /// first exchange, and without any. Give it to
    /// [`Transport::set_job_key`](crate::Transport::set_job_key) before adding peers.
    fn job_key(&self) -> Option<JobKey> {
        None
    }

    /// Tells the launcher this process is done with wire-up. Call before exiting: some
    /// launchers (Hydra) treat a process that leaves without it as failed.
    fn finalize(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

/// The exchange of a single process: rank 0 of 1, nothing to exchange.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalModex;

impl Modex for LocalModex {
    fn exchange(&mut self, my_uris: &str) -> Result<Vec<String>, Error> {
        Ok(vec![my_uris.to_owned()])
    }

    fn rank(&self) -> u32 {
        0
    }

    fn size(&self) -> u32 {
        1
    }
}

/// The exchange through a PMI-1 server: put own list, barrier, get everybody's.
#[derive(Debug)]
pub struct PmiModex<S> {
    client: Option<PmiClient<S>>,
    rank: u32,
    size: u32,
    epoch: u32,
    job_key: Option<JobKey>,
}

impl<S: Read + Write> PmiModex<S> {
    /// Wraps an initialized client. `rank` and `size` come from the launcher
    /// (`PMI_RANK` / `PMI_SIZE`).
    pub fn new(client: PmiClient<S>, rank: u32, size: u32) -> Self {
        Self {
            client: Some(client),
            rank,
            size,
            epoch: 0,
            job_key: None,
        }
    }

    fn client(&mut self) -> Result<&mut PmiClient<S>, Error> {
        self.client
            .as_mut()
            .ok_or_else(|| Error::Wireup("PMI connection already finalized".into()))
    }
}

impl<S: Read + Write> Modex for PmiModex<S> {
    fn exchange(&mut self, my_uris: &str) -> Result<Vec<String>, Error> {
        // A fresh key per exchange: PMI-1 servers may refuse to overwrite a key.
        let epoch = self.epoch;
        self.epoch += 1;
        let (rank, size) = (self.rank, self.size);
        let key = |r: u32| format!("rbtl{epoch}-{r}");
        // The job key: rank 0 draws it and puts it with its addresses before the one
        // barrier; the others read it after.
        let fresh = match (&self.job_key, rank) {
            (None, 0) => Some(JobKey::generate()?),
            _ => None,
        };
        let had_key = self.job_key.is_some();
        let c = self.client()?;
        c.put_long(&key(rank), my_uris)?;
        if let Some(k) = &fresh {
            c.put_long("rbtl-jobkey", &k.to_hex())?;
        }
        c.barrier()?;
        let got = match (had_key, fresh) {
            (true, _) => None,
            (false, Some(k)) => Some(k),
            (false, None) => {
                let hex = c
                    .get_long("rbtl-jobkey")
                    .map_err(|e| Error::Wireup(format!("job key of rank 0: {e}")))?;
                Some(
                    JobKey::from_hex(&hex)
                        .map_err(|e| Error::Wireup(format!("job key of rank 0 from PMI: {e}")))?,
                )
            }
        };
        if got.is_some() {
            self.job_key = got;
        }
        let c = self.client()?;
        (0..size)
            .map(|r| {
                c.get_long(&key(r))
                    .map_err(|e| Error::Wireup(format!("addresses of rank {r}: {e}")))
            })
            .collect()
    }

    fn rank(&self) -> u32 {
        self.rank
    }

    fn size(&self) -> u32 {
        self.size
    }

    fn job_key(&self) -> Option<JobKey> {
        self.job_key.clone()
    }

    fn finalize(&mut self) -> Result<(), Error> {
        match self.client.take() {
            Some(c) => c.finalize().map(drop),
            None => Ok(()),
        }
    }
}

/// The ways ranks can exchange addresses (`RINGBTL_WIREUP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireupKind {
    /// PMIx (Open MPI's `mpirun`, `srun --mpi=pmix`), through the system's libpmix.
    Pmix,
    /// PMI-1 over `PMI_FD`.
    Pmi,
    /// Rank variables from the environment plus the rendezvous at `RINGBTL_ROOT`.
    Env,
    /// One process, no exchange.
    Local,
}

impl WireupKind {
    /// What `RINGBTL_WIREUP` accepts.
    pub(crate) const ACCEPTED: &'static str = "accepted values are pmix, pmi, env, local";

    /// The kind named `name` in `RINGBTL_WIREUP` (`pmi1` is `pmi`).
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        match name.trim() {
            "pmix" => Some(Self::Pmix),
            "pmi" | "pmi1" => Some(Self::Pmi),
            "env" => Some(Self::Env),
            "local" => Some(Self::Local),
            _ => None,
        }
    }

    /// The name used in `RINGBTL_WIREUP`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pmix => "pmix",
            Self::Pmi => "pmi",
            Self::Env => "env",
            Self::Local => "local",
        }
    }
}

impl FromStr for WireupKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        Self::from_name(s).ok_or_else(|| {
            Error::Config(format!("RINGBTL_WIREUP={:?}: {}", s.trim(), Self::ACCEPTED))
        })
    }
}

impl std::fmt::Display for WireupKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The exchange chosen for this process, with its rank information.
#[derive(Debug)]
pub struct Wireup {
    kind: WireupKind,
    info: RankInfo,
    timeout: Duration,
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Pmix(pmix::PmixModex),
    Pmi(PmiModex<UnixStream>),
    Env(Rendezvous),
    Local(LocalModex),
}

impl Wireup {
    /// Chooses and prepares the exchange from the process environment (see the module
    /// docs). Under PMI-1 this already talks to the launcher (`init`); under the
    /// rendezvous, rank 0 already listens.
    pub fn from_env() -> Result<Self, Error> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// As [`from_env`](Self::from_env), reading variables through `get`.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let cfg = WireupConfig::default().exchange_from_vars(&get)?;
        Self::from_config(&cfg, get)
    }

    /// As [`from_vars`](Self::from_vars), with the exchange, the rendezvous address, the
    /// PMIx library and the time limit taken from `cfg` ([`WireupConfig::exchange`],
    /// [`root`](WireupConfig::root), [`pmix_lib`](WireupConfig::pmix_lib),
    /// [`timeout`](WireupConfig::timeout)); `get` gives the launcher's variables.
    pub fn from_config(
        cfg: &WireupConfig,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, Error> {
        cfg.validate().map_err(Error::Config)?;
        let var = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let timeout = cfg.timeout;
        let kind = match cfg.exchange {
            Some(k) => k,
            None if var("PMIX_NAMESPACE").is_some() || var("PMIX_RANK").is_some() => {
                WireupKind::Pmix
            }
            None if var("PMI_FD").is_some() => WireupKind::Pmi,
            None if cfg.root.is_some() => WireupKind::Env,
            None => WireupKind::Local,
        };
        let (info, inner) = match kind {
            WireupKind::Pmix => {
                let m = pmix::PmixModex::init(timeout, cfg.pmix_lib.as_deref())?;
                let launcher = RankInfo::from_vars(&get).ok().flatten();
                let info = RankInfo {
                    rank: m.rank(),
                    size: m.size(),
                    local_rank: launcher.as_ref().and_then(|i| i.local_rank),
                    local_size: launcher.as_ref().and_then(|i| i.local_size),
                    source: "PMIx",
                };
                (info, Inner::Pmix(m))
            }
            WireupKind::Pmi => {
                let fd = var("PMI_FD").ok_or_else(|| {
                    Error::Config("RINGBTL_WIREUP=pmi needs PMI_FD (set by the launcher)".into())
                })?;
                let info = RankInfo::from_vars(&get)?.ok_or_else(|| {
                    Error::Config(
                        "PMI_FD is set but PMI_RANK / PMI_SIZE are not; launchers that hand out \
                         the rank only through the PMI_ID handshake are not supported"
                            .into(),
                    )
                })?;
                let stream = pmi::connect_fd(&fd)?;
                stream
                    .set_read_timeout(Some(timeout))
                    .and_then(|()| stream.set_write_timeout(Some(timeout)))
                    .map_err(|e| Error::io("PMI socket timeout", e))?;
                let client = PmiClient::init(stream)?;
                let m = PmiModex::new(client, info.rank, info.size);
                (info, Inner::Pmi(m))
            }
            WireupKind::Env => {
                let info = RankInfo::from_vars(&get)?.ok_or_else(|| {
                    Error::Config(
                        "RINGBTL_WIREUP=env needs the rank and size: RINGBTL_RANK / RINGBTL_SIZE, \
                         OMPI_COMM_WORLD_RANK / _SIZE, PMI_RANK / PMI_SIZE or SLURM_PROCID / \
                         SLURM_NTASKS"
                            .into(),
                    )
                })?;
                match &cfg.root {
                    Some(root) => {
                        let (token, key) = env_job_identity(&var)?;
                        let mut r = Rendezvous::from_root(
                            root.trim(),
                            info.rank,
                            info.size,
                            token,
                            timeout,
                        )?;
                        if let Some(key) = key {
                            r = r.with_key(key);
                        }
                        (info, Inner::Env(r))
                    }
                    None if info.size == 1 => (info, Inner::Local(LocalModex)),
                    None => {
                        let n = info.size;
                        return Err(Error::Config(format!(
                            "RINGBTL_ROOT=host:port is needed to exchange addresses between \
                             {n} ranks (rank 0 listens there)"
                        )));
                    }
                }
            }
            WireupKind::Local => {
                if let Some(i) = RankInfo::from_vars(&get)?.filter(|i| i.size > 1) {
                    return Err(Error::Config(format!(
                        "launched as rank {} of {} ({}) but no address exchange is available: \
                         set RINGBTL_ROOT=host:port, or run under a PMIx or PMI-1/PMI-2 \
                         launcher (mpirun, srun --mpi=pmix or --mpi=pmi2, mpiexec.hydra)",
                        i.rank, i.size, i.source
                    )));
                }
                (RankInfo::single(), Inner::Local(LocalModex))
            }
        };
        Ok(Self {
            kind,
            info,
            timeout,
            inner,
        })
    }

    /// The exchange in use.
    pub fn kind(&self) -> WireupKind {
        self.kind
    }

    /// Rank, size and node-local placement.
    pub fn info(&self) -> &RankInfo {
        &self.info
    }

    /// The exchange's time limit.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn modex(&mut self) -> &mut dyn Modex {
        match &mut self.inner {
            Inner::Pmix(m) => m,
            Inner::Pmi(m) => m,
            Inner::Env(m) => m,
            Inner::Local(m) => m,
        }
    }
}

impl Modex for Wireup {
    fn exchange(&mut self, my_uris: &str) -> Result<Vec<String>, Error> {
        let table = self.modex().exchange(my_uris)?;
        if table.len() != self.info.size as usize {
            return Err(Error::Wireup(format!(
                "exchange returned {} entries for {} ranks",
                table.len(),
                self.info.size
            )));
        }
        Ok(table)
    }

    fn rank(&self) -> u32 {
        self.info.rank
    }

    fn size(&self) -> u32 {
        self.info.size
    }

    fn job_key(&self) -> Option<JobKey> {
        match &self.inner {
            Inner::Pmix(m) => m.job_key(),
            Inner::Pmi(m) => m.job_key(),
            Inner::Env(m) => m.job_key(),
            Inner::Local(m) => m.job_key(),
        }
    }

    fn finalize(&mut self) -> Result<(), Error> {
        self.modex().finalize()
    }
}

/// The variables of the job's identity, read through the core's table.
const JOB_VARS: [&str; 3] = [
    "RINGBTL_JOB_TOKEN",
    "RINGBTL_JOB_KEY",
    "RINGBTL_JOB_KEY_FILE",
];

/// The job token and key of the env + root form, read through the core's table (the
/// parsing and checks of [`Config::from_env`](crate::Config::from_env)):
/// `RINGBTL_JOB_TOKEN`, and `RINGBTL_JOB_KEY` (64 hex digits), else the file named by
/// `RINGBTL_JOB_KEY_FILE` (mode 0600), else no key.
fn env_job_identity(get: &dyn Fn(&str) -> Option<String>) -> Result<(u64, Option<JobKey>), Error> {
    let mut core = CoreConfig::default();
    let only = |k: &str| JOB_VARS.contains(&k).then(|| get(k)).flatten();
    core.apply_vars(&only, &mut |_| {}).map_err(Error::Config)?;
    let key = match (core.job_key, &core.job_key_file) {
        (Some(key), _) => Some(key),
        (None, Some(path)) => Some(JobKey::from_file(path)?),
        (None, None) => None,
    };
    Ok((core.token, key))
}

/// The job key of the env + root form: `RINGBTL_JOB_KEY` (64 hex digits), else the file
/// named by `RINGBTL_JOB_KEY_FILE` (mode 0600), else none; read as
/// [`Config::from_env`](crate::Config::from_env) reads them.
pub fn env_job_key(var: impl Fn(&str) -> Option<String>) -> Result<Option<JobKey>, Error> {
    env_job_identity(&var).map(|(_, key)| key)
}

/// Parses the integer variable `name` in `lo..=hi` (see [`crate::param::parse_u64`]).
pub(crate) fn parse_u64(name: &str, v: &str, lo: u64, hi: u64) -> Result<u64, Error> {
    crate::param::parse_u64(name, v, lo, hi).map_err(Error::Config)
}

/// Reads `RINGBTL_WIREUP_TIMEOUT_MS` (milliseconds, 10..=3 600 000) through `get`.
pub fn timeout_from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Duration, Error> {
    let mut cfg = WireupConfig::default();
    let only = |k: &str| {
        (crate::param::current_name(k) == "RINGBTL_WIREUP_TIMEOUT_MS")
            .then(|| get(k))
            .flatten()
    };
    cfg.apply_vars(&only, &mut |_| {}).map_err(Error::Config)?;
    Ok(cfg.timeout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::os::fd::IntoRawFd;
    use std::thread;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn wireup(pairs: &[(&str, &str)]) -> Result<Wireup, Error> {
        let m = map(pairs);
        Wireup::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn local_by_default() {
        let mut w = wireup(&[]).unwrap();
        assert_eq!(w.kind(), WireupKind::Local);
        assert_eq!((w.rank(), w.size()), (0, 1));
        assert_eq!(w.timeout(), DEFAULT_TIMEOUT);
        assert_eq!(
            w.exchange("tcp://127.0.0.1:5").unwrap(),
            ["tcp://127.0.0.1:5"]
        );
        w.finalize().unwrap();
        let w = wireup(&[("RINGBTL_RANK", "0"), ("RINGBTL_SIZE", "1")]).unwrap();
        assert_eq!(w.kind(), WireupKind::Local);
    }

    #[test]
    fn launched_without_exchange_is_an_error() {
        let e = wireup(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "4")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 1 of 4 (Open MPI)") && e.contains("RINGBTL_ROOT"),
            "{e}"
        );
        let e = wireup(&[
            ("RINGBTL_WIREUP", "env"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("RINGBTL_ROOT"), "{e}");
        let e = wireup(&[("RINGBTL_WIREUP", "env")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("RINGBTL_RANK"), "{e}");
    }

    #[test]
    fn bad_settings_name_the_variable() {
        for (pairs, needle) in [
            (&[("RINGBTL_WIREUP", "mpi")][..], "RINGBTL_WIREUP=\"mpi\""),
            (
                &[("RINGBTL_WIREUP_TIMEOUT_MS", "5")][..],
                "RINGBTL_WIREUP_TIMEOUT_MS",
            ),
            (
                &[("RINGBTL_WIREUP_TIMEOUT_MS", "soon")][..],
                "RINGBTL_WIREUP_TIMEOUT_MS",
            ),
            (&[("RINGBTL_WIREUP", "pmi")][..], "PMI_FD"),
            (
                &[("PMI_FD", "999999"), ("PMI_RANK", "0"), ("PMI_SIZE", "2")][..],
                "PMI_FD=999999",
            ),
            (&[("PMI_FD", "3")][..], "PMI_RANK"),
            (
                &[
                    ("RINGBTL_ROOT", "nowhere"),
                    ("RINGBTL_RANK", "1"),
                    ("RINGBTL_SIZE", "2"),
                ][..],
                "RINGBTL_ROOT",
            ),
            (
                &[
                    ("RINGBTL_ROOT", "127.0.0.1:0"),
                    ("RINGBTL_RANK", "0"),
                    ("RINGBTL_SIZE", "2"),
                    ("RINGBTL_JOB_TOKEN", "x"),
                ][..],
                "RINGBTL_JOB_TOKEN",
            ),
        ] {
            let e = wireup(pairs).unwrap_err().to_string();
            assert!(e.contains(needle), "{e:?} should contain {needle:?}");
        }
        assert_eq!(
            timeout_from_vars(|_| Some("1500".into())).unwrap(),
            Duration::from_millis(1500)
        );
    }

    /// A launcher that offers PMIx where its client library cannot be opened: the error
    /// names what was tried and the ways out, whether PMIx was forced or detected.
    #[test]
    fn pmix_without_its_library_is_a_clear_error() {
        let absent = "libpmix-absent-for-ringbtl-tests.so.0";
        for pairs in [
            &[("RINGBTL_WIREUP", "pmix"), (pmix::LIB_VAR, absent)][..],
            &[
                ("PMIX_NAMESPACE", "job.0"),
                ("PMIX_RANK", "1"),
                ("OMPI_COMM_WORLD_RANK", "1"),
                ("OMPI_COMM_WORLD_SIZE", "4"),
                (pmix::LIB_VAR, absent),
            ][..],
        ] {
            let e = wireup(pairs).unwrap_err().to_string();
            for needle in [
                "offers PMIx but its client library could not be loaded",
                absent,
                pmix::LIB_VAR,
                "RINGBTL_ROOT",
                "--mpi=pmi2",
            ] {
                assert!(e.contains(needle), "{e:?} should contain {needle:?}");
            }
        }
    }

    #[test]
    fn env_root_is_chosen_when_root_is_set() {
        let mut w = wireup(&[
            ("RINGBTL_ROOT", "127.0.0.1:0"),
            ("RINGBTL_RANK", "0"),
            ("RINGBTL_SIZE", "1"),
            ("RINGBTL_WIREUP_TIMEOUT_MS", "2000"),
        ])
        .unwrap();
        assert_eq!(w.kind(), WireupKind::Env);
        assert_eq!(w.timeout(), Duration::from_secs(2));
        assert_eq!(
            w.exchange("tcp://127.0.0.1:9").unwrap(),
            ["tcp://127.0.0.1:9"]
        );
    }

    #[test]
    fn pmi_modex_with_a_fake_server() {
        // vallen_max=20 forces the 40-odd-byte lists to be split across keys.
        let n = 3u32;
        let streams = pmi::tests::fake_server(n as usize, 20);
        let ranks: Vec<_> = streams
            .into_iter()
            .enumerate()
            .map(|(r, s)| {
                thread::spawn(move || {
                    let mut m = PmiModex::new(PmiClient::init(s)?, r as u32, n);
                    let first =
                        m.exchange(&format!("tcp://10.1.0.{r}:4000;tcp://[fd00::{r}]:4000"))?;
                    let second = m.exchange(&format!("tcp://10.2.0.{r}:1"))?;
                    m.finalize()?;
                    assert!(m.exchange("x").is_err());
                    Ok::<_, Error>((first, second))
                })
            })
            .collect();
        for h in ranks {
            let (first, second) = h.join().unwrap().unwrap();
            for r in 0..n as usize {
                assert_eq!(
                    first[r],
                    format!("tcp://10.1.0.{r}:4000;tcp://[fd00::{r}]:4000")
                );
                assert_eq!(second[r], format!("tcp://10.2.0.{r}:1"));
            }
        }
    }

    #[test]
    fn pmi_chosen_from_pmi_fd() {
        let mut streams = pmi::tests::fake_server(1, 64);
        let fd = streams.pop().unwrap().into_raw_fd().to_string();
        let mut w = wireup(&[("PMI_FD", &fd), ("PMI_RANK", "0"), ("PMI_SIZE", "1")]).unwrap();
        assert_eq!(w.kind(), WireupKind::Pmi);
        assert_eq!(w.info().source, "PMI");
        assert_eq!(
            w.exchange("tcp://10.0.0.1:2").unwrap(),
            ["tcp://10.0.0.1:2"]
        );
        w.finalize().unwrap();
    }
}
