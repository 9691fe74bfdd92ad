//! Rank discovery from the launcher's environment.
//!
//! Every launcher exports the process's rank and the job size under its own names.
//! [`RankInfo::from_vars`] looks them up in a fixed order, taking the first launcher
//! whose variables are present:
//!
//! | source | rank, size | local rank, local size |
//! |---|---|---|
//! | ringbtl | `RINGBTL_RANK`, `RINGBTL_SIZE` | `RINGBTL_LOCAL_RANK`, `RINGBTL_LOCAL_SIZE` |
//! | Open MPI (`mpirun`) | `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE` |
//! | PMI (MPICH Hydra, Flux) | `PMI_RANK`, `PMI_SIZE` | `MPI_LOCALRANKID`, `MPI_LOCALNRANKS` |
//! | Slurm (`srun`) | `SLURM_PROCID`, `SLURM_NTASKS` (or `SLURM_NPROCS`) | `SLURM_LOCALID`, — |
//!
//! The lookup goes through a closure, so tests pass a map instead of the process
//! environment. Values are checked: a rank without a size, a non-number, or a rank not
//! below the size is an error naming the variables.

use super::parse_u64;
use crate::error::Error;

/// This process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    /// Rank in the job, `0..size`.
    pub rank: u32,
    /// Number of ranks in the job.
    pub size: u32,
    /// Rank among the processes of this node, when the launcher says.
    pub local_rank: Option<u32>,
    /// Number of processes of the job on this node, when the launcher says.
    pub local_size: Option<u32>,
    /// Which launcher's variables were used (`"ringbtl"`, `"Open MPI"`, `"PMI"`, `"Slurm"`,
    /// or `"single process"`).
    pub source: &'static str,
}

struct Source {
    name: &'static str,
    rank: &'static str,
    size: &'static [&'static str],
    local_rank: Option<&'static str>,
    local_size: Option<&'static str>,
}

const SOURCES: &[Source] = &[
    Source {
        name: "ringbtl",
        rank: "RINGBTL_RANK",
        size: &["RINGBTL_SIZE"],
        local_rank: Some("RINGBTL_LOCAL_RANK"),
        local_size: Some("RINGBTL_LOCAL_SIZE"),
    },
    Source {
        name: "Open MPI",
        rank: "OMPI_COMM_WORLD_RANK",
        size: &["OMPI_COMM_WORLD_SIZE"],
        local_rank: Some("OMPI_COMM_WORLD_LOCAL_RANK"),
        local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    Source {
        name: "PMI",
        rank: "PMI_RANK",
        size: &["PMI_SIZE"],
        local_rank: Some("MPI_LOCALRANKID"),
        local_size: Some("MPI_LOCALNRANKS"),
    },
    Source {
        name: "Slurm",
        rank: "SLURM_PROCID",
        size: &["SLURM_NTASKS", "SLURM_NPROCS"],
        local_rank: Some("SLURM_LOCALID"),
        local_size: None,
    },
];

impl RankInfo {
    /// The single-process job: rank 0 of 1.
    pub fn single() -> Self {
        Self {
            rank: 0,
            size: 1,
            local_rank: Some(0),
            local_size: Some(1),
            source: "single process",
        }
    }

    /// Reads the rank variables through `get` (see the module docs for the order).
    /// `Ok(None)` when no launcher variables are set at all.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, Error> {
        let var = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        for src in SOURCES {
            let rank = var(src.rank);
            let size = src.size.iter().find_map(|k| var(k).map(|v| (*k, v)));
            let (rank, (size_var, size)) = match (rank, size) {
                (None, None) => continue,
                (Some(r), Some(s)) => (r, s),
                (Some(_), None) => {
                    return Err(Error::Config(format!(
                        "{} is set but {} is not",
                        src.rank,
                        src.size.join(" / ")
                    )))
                }
                (None, Some((k, _))) => {
                    return Err(Error::Config(format!("{k} is set but {} is not", src.rank)))
                }
            };
            let size = parse_u64(size_var, &size, 1, u64::from(u32::MAX))? as u32;
            let rank = parse_u64(src.rank, &rank, 0, u64::from(u32::MAX))? as u32;
            if rank >= size {
                return Err(Error::Config(format!(
                    "{}={rank} is not below {size_var}={size}",
                    src.rank
                )));
            }
            let local_rank = match src.local_rank.and_then(|k| var(k).map(|v| (k, v))) {
                Some((k, v)) => Some(parse_u64(k, &v, 0, u64::from(size - 1))? as u32),
                None => None,
            };
            let local_size = match src.local_size.and_then(|k| var(k).map(|v| (k, v))) {
                Some((k, v)) => Some(parse_u64(k, &v, 1, u64::from(size))? as u32),
                None => None,
            };
            if let (Some(lr), Some(ls)) = (local_rank, local_size) {
                if lr >= ls {
                    return Err(Error::Config(format!(
                        "{}={lr} is not below {}={ls}",
                        src.local_rank.unwrap_or_default(),
                        src.local_size.unwrap_or_default()
                    )));
                }
            }
            return Ok(Some(Self {
                rank,
                size,
                local_rank,
                local_size,
                source: src.name,
            }));
        }
        Ok(None)
    }
}

/// Variables that give the number of the job's processes on this node, in lookup order.
pub const LOCAL_SIZE_VARS: &[&str] = &[
    "RINGBTL_LOCAL_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
];

/// This node runs more of the job's processes than this process may use CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Oversubscription {
    /// Processes of the job on this node.
    pub local_size: u32,
    /// CPUs this process may run on (affinity mask and cgroup quota).
    pub cpus: usize,
    /// The variable `local_size` came from.
    pub source: &'static str,
}

impl std::fmt::Display for Oversubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ranks on this node ({}) for {} CPU(s)",
            self.local_size, self.source, self.cpus
        )
    }
}

/// Reads the node-local process count through `get` ([`LOCAL_SIZE_VARS`]; Slurm's
/// `2(x3),1` form counts as its first number) and compares it with the CPUs this process
/// may use. `None` when the node is not oversubscribed or no launcher says.
pub fn oversubscription(get: impl Fn(&str) -> Option<String>) -> Option<Oversubscription> {
    let (source, local_size) = LOCAL_SIZE_VARS.iter().find_map(|&k| {
        let v = get(k)?;
        let digits: String = v.trim().chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u32>().ok().map(|n| (k, n))
    })?;
    let cpus = node_cpus();
    oversubscribed(local_size, cpus).then_some(Oversubscription {
        local_size,
        cpus,
        source,
    })
}

/// CPUs of this node: the online CPUs (`/sys/devices/system/cpu/online`), not this
/// process's affinity mask, since a launcher that binds each rank to one core leaves every
/// rank a single CPU without oversubscribing anything. Falls back to the CPUs this process
/// may use.
pub fn node_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| count_cpu_list(&s))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Counts the CPUs of a kernel CPU list such as `0-3,8,10-11`.
pub fn count_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.trim().split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let c = part.parse::<usize>().ok()?;
                (c, c)
            }
        };
        n += hi.checked_sub(lo)? + 1;
    }
    (n > 0).then_some(n)
}

/// True when `local_size` processes share `cpus` CPUs with fewer than one CPU each.
pub fn oversubscribed(local_size: u32, cpus: usize) -> bool {
    local_size as usize > cpus
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn oversubscription_from_launcher_variables() {
        let many = (3 * node_cpus()).to_string();
        let slurm = format!("{many}(x2),1");
        for (k, v) in [
            ("OMPI_COMM_WORLD_LOCAL_SIZE", many.as_str()),
            ("MPI_LOCALNRANKS", many.as_str()),
            ("SLURM_TASKS_PER_NODE", slurm.as_str()),
        ] {
            let o = oversubscription(|q| (q == k).then(|| v.to_owned())).unwrap();
            assert_eq!(o.source, k);
            assert_eq!(o.local_size.to_string(), many);
            assert!(o.to_string().contains(k), "{o}");
        }
        assert_eq!(oversubscription(|_| None), None);
        assert_eq!(oversubscription(|_| Some("1".into())), None);
        assert_eq!(oversubscription(|_| Some("lots".into())), None);
        assert!(oversubscribed(3, 2) && !oversubscribed(2, 2));
        assert_eq!(count_cpu_list("0-3,8,10-11\n"), Some(7));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("x"), None);
    }

    fn vars(pairs: &[(&str, &str)]) -> Result<Option<RankInfo>, Error> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RankInfo::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn nothing_set() {
        assert_eq!(vars(&[]).unwrap(), None);
        assert_eq!(vars(&[("RINGBTL_RANK", " ")]).unwrap(), None);
    }

    #[test]
    fn each_launcher() {
        let r = vars(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.rank, r.size, r.local_rank, r.local_size),
            (3, 8, Some(1), Some(2))
        );
        assert_eq!(r.source, "Open MPI");

        let r = vars(&[
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "4"),
            ("MPI_LOCALRANKID", "0"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.rank, r.size, r.local_rank, r.source),
            (0, 4, Some(0), "PMI")
        );

        let r = vars(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NPROCS", "6"),
            ("SLURM_LOCALID", "1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.rank, r.size, r.local_rank, r.local_size),
            (5, 6, Some(1), None)
        );
        assert_eq!(r.source, "Slurm");
    }

    #[test]
    fn precedence() {
        let r = vars(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("PMI_RANK", "2"),
            ("PMI_SIZE", "3"),
            ("RINGBTL_RANK", "0"),
            ("RINGBTL_SIZE", "1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((r.rank, r.size, r.source), (0, 1, "ringbtl"));
        let r = vars(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("PMI_RANK", "2"),
            ("PMI_SIZE", "3"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(r.source, "PMI");
    }

    #[test]
    fn malformed_and_inconsistent() {
        for (pairs, needle) in [
            (&[("RINGBTL_RANK", "1")][..], "RINGBTL_SIZE"),
            (&[("RINGBTL_SIZE", "2")][..], "RINGBTL_RANK"),
            (
                &[("RINGBTL_RANK", "2"), ("RINGBTL_SIZE", "2")][..],
                "not below",
            ),
            (
                &[("RINGBTL_RANK", "x"), ("RINGBTL_SIZE", "2")][..],
                "RINGBTL_RANK",
            ),
            (
                &[("RINGBTL_RANK", "0"), ("RINGBTL_SIZE", "0")][..],
                "RINGBTL_SIZE",
            ),
            (
                &[("RINGBTL_RANK", "-1"), ("RINGBTL_SIZE", "2")][..],
                "RINGBTL_RANK",
            ),
            (
                &[("PMI_RANK", "0"), ("PMI_SIZE", "99999999999")][..],
                "PMI_SIZE",
            ),
            (
                &[
                    ("OMPI_COMM_WORLD_RANK", "0"),
                    ("OMPI_COMM_WORLD_SIZE", "4"),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
                    ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
                ][..],
                "OMPI_COMM_WORLD_LOCAL_RANK=2 is not below OMPI_COMM_WORLD_LOCAL_SIZE=2",
            ),
            (
                &[
                    ("SLURM_PROCID", "0"),
                    ("SLURM_NTASKS", "2"),
                    ("SLURM_LOCALID", "7"),
                ][..],
                "SLURM_LOCALID",
            ),
        ] {
            let e = vars(pairs).unwrap_err().to_string();
            assert!(e.contains(needle), "{e:?} should contain {needle:?}");
        }
    }
}
