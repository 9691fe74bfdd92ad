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

use crate::config::parse_u64;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

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
