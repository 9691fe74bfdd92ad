//! Peers of other jobs: the key of the connections with each job this process talks to,
//! and the id each of their processes goes by here.
//!
//! Within a job a process is known by its process id, on the wire and here alike. A
//! process of another job (one this job spawned, or connected to) is named on the wire by
//! its job's token and its process id *in that job*; here it goes by a *local id* that the
//! driver chose when it added the process ([`Core::add_peer_of_job`]), one that no process
//! of this job has. Every decision that both ends must take alike (which dial wins a
//! simultaneous connect, who sends early, who dials links) compares the wire names, job
//! first: both ends see the same two names.

use std::collections::HashMap;
use std::net::SocketAddr;

use super::core::{Core, MAX_PEERS};
use crate::auth::JobKey;
use crate::error::{Error, SendError};
use crate::wire::PeerId;

/// The other jobs this process talks to, and the processes of theirs it knows.
#[derive(Debug, Default)]
pub(super) struct Jobs {
    /// A job's token -> the key of the connections with it (its pair key).
    keys: HashMap<u64, JobKey>,
    /// A local id -> the job and process id it stands for.
    origin: HashMap<PeerId, (u64, PeerId)>,
    /// A job and process id -> its local id.
    local: HashMap<(u64, PeerId), PeerId>,
}

impl Core {
    /// Lets the processes of job `job` (its token) connect, and be dialed, with `key` (the
    /// pair key of the two jobs, [`auth::pair_key`](crate::auth::pair_key)). Adding a job
    /// again replaces its key for later handshakes. This process's own job is refused.
    pub fn add_job(&mut self, job: u64, key: JobKey) -> Result<(), Error> {
        if job == self.cfg.token {
            return Err(Error::Config(format!(
                "job {job:x} is this process's own job, not another"
            )));
        }
        self.jobs.keys.insert(job, key);
        Ok(())
    }

    /// Adds (or updates the addresses of) process `rank` of job `job`, which goes by `peer`
    /// here; `addrs` and `binds` as in [`add_peer_bound`](Self::add_peer_bound). The job
    /// must have been added ([`add_job`](Self::add_job)); `peer` must be an id that no
    /// process of this job and no other process of another job goes by.
    pub fn add_peer_of_job(
        &mut self,
        peer: PeerId,
        job: u64,
        rank: PeerId,
        addrs: Vec<SocketAddr>,
        binds: Vec<Option<SocketAddr>>,
    ) -> Result<(), SendError> {
        let taken = match self.jobs.origin.get(&peer) {
            Some(&o) => o != (job, rank),
            None => self.ep(peer).is_some(),
        };
        let other_id = self
            .jobs
            .local
            .get(&(job, rank))
            .is_some_and(|&p| p != peer);
        if !self.jobs.keys.contains_key(&job) || taken || other_id || peer.0 >= MAX_PEERS {
            return Err(SendError::UnknownPeer(peer));
        }
        self.add_peer_bound(peer, addrs, binds)?;
        self.jobs.origin.insert(peer, (job, rank));
        self.jobs.local.insert((job, rank), peer);
        Ok(())
    }

    /// The job and process id `peer` goes by on the wire.
    pub(super) fn wire_name(&self, peer: PeerId) -> (u64, PeerId) {
        self.jobs
            .origin
            .get(&peer)
            .copied()
            .unwrap_or((self.cfg.token, peer))
    }

    /// The key of the connections with processes of `job`: the job key for our own job,
    /// the pair key for a job added, none for any other.
    pub(super) fn key_of_job(&self, job: u64) -> Option<&JobKey> {
        if job == self.cfg.token {
            Some(&self.key)
        } else {
            self.jobs.keys.get(&job)
        }
    }

    /// The key of the connections with `peer`.
    pub(super) fn key_of(&self, peer: PeerId) -> Option<&JobKey> {
        self.key_of_job(self.wire_name(peer).0)
    }

    /// The id process `rank` of `job` goes by here: its process id within our job; the
    /// local id it was added under for another (none before it was added).
    pub(super) fn local_id(&self, job: u64, rank: PeerId) -> Option<PeerId> {
        if job == self.cfg.token {
            Some(rank)
        } else {
            self.jobs.local.get(&(job, rank)).copied()
        }
    }

    /// True when `peer`'s wire name is below ours: its dial wins a simultaneous connect,
    /// and the rules that follow from that one (see `send_early`, links) take its side.
    pub(super) fn below_me(&self, peer: PeerId) -> bool {
        self.wire_name(peer) < (self.cfg.token, self.cfg.pid)
    }
}
