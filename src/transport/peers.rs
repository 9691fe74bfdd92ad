//! Adding peers: processes of this job and of other jobs, at the addresses they published.

use std::net::SocketAddr;

use super::Transport;
use crate::auth::{self, JobKey, KEY_LEN, PUBLIC_KEY};
use crate::error::Error;
use crate::wire::{PeerId, MAX_LINKS};
use crate::wireup::{route, uri};

impl Transport {
    /// Makes `id` reachable at the addresses of a URI list published by its
    /// [`uris`](Self::uris). The list is parsed strictly (an error quotes the bad URI).
    /// With interface selection (`listen: None`), addresses on the subnet of a selected
    /// local interface come first and are dialed from that interface's address; the
    /// others follow, and addresses no selected interface can reach are left out (see
    /// [`order_peer_addrs`](crate::wireup::order_peer_addrs)). On a failed connect the next
    /// address is tried.
    pub fn add_peer_uris(&mut self, id: PeerId, uris: &str) -> Result<(), Error> {
        self.add_uris(id, uris, None)
    }

    /// The public key of this transport's job ([`JobKey::public`] of its job key; of the
    /// [`PUBLIC_KEY`] without one), which another job needs to talk to this one
    /// ([`add_job`](Self::add_job)).
    pub fn job_public_key(&self) -> [u8; KEY_LEN] {
        self.job_key().public()
    }

    /// The job key in force ([`PUBLIC_KEY`] without one).
    fn job_key(&self) -> &JobKey {
        self.cfg.core.job_key.as_ref().unwrap_or(&PUBLIC_KEY)
    }

    /// Lets the processes of job `job` (its token) connect to this transport, and be
    /// dialed by it, with the pair key derived from this transport's job key and
    /// `public`, that job's [public key](Self::job_public_key) (see
    /// [`auth::pair_key`]). Set the job key first. Adding a job again replaces its key
    /// for later handshakes.
    pub fn add_job(&mut self, job: u64, public: &[u8; KEY_LEN]) -> Result<(), Error> {
        let key = auth::pair_key(self.job_key(), self.cfg.core.token, public, job)?;
        self.core.add_job(job, key)
    }

    /// As [`add_peer_uris`](Self::add_peer_uris), for process `rank` of job `job` (added
    /// with [`add_job`](Self::add_job)), which goes by `id` here: an id that no process of
    /// this job, and no other process of another job, goes by. Its messages arrive from
    /// `id`, and sends to `id` reach it.
    pub fn add_peer_of_job_uris(
        &mut self,
        id: PeerId,
        job: u64,
        rank: PeerId,
        uris: &str,
    ) -> Result<(), Error> {
        self.add_uris(id, uris, Some((job, rank)))
    }

    fn add_uris(
        &mut self,
        id: PeerId,
        uris: &str,
        of_job: Option<(u64, PeerId)>,
    ) -> Result<(), Error> {
        self.check_auth()?;
        let addrs = uri::parse_uri_list(uris)?;
        let Some(local) = &self.ifaces else {
            return self.add_unbound(id, addrs, of_job);
        };
        let routes = route::order_peer_addrs(local, &addrs);
        if routes.is_empty() {
            let ours = local
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            return Err(Error::Wireup(format!(
                "{id} published {uris:?}, but none of it is reachable from the selected \
                 interfaces ({ours}); check RINGBTL_IF_INCLUDE / RINGBTL_IF_EXCLUDE"
            )));
        }
        let (remotes, binds) = routes
            .iter()
            .map(|r| (r.remote, r.bind.map(|ip| SocketAddr::new(ip, 0))))
            .unzip();
        self.add_addrs(id, remotes, binds, of_job)?;
        let plan = route::link_plan(&routes, self.cfg.wireup.links as usize);
        let links = plan
            .iter()
            .skip(1)
            .map(|r| (r.remote, r.bind.map(|ip| SocketAddr::new(ip, 0))))
            .collect();
        self.core.set_link_routes(id, links);
        Ok(())
    }

    /// Makes `id` reachable at `addrs` (tried in order, round robin on retries). The
    /// connection is opened on the first send (lazy connect), or accepted when the peer
    /// dials first.
    pub fn add_peer(&mut self, id: PeerId, addrs: Vec<SocketAddr>) -> Result<(), Error> {
        self.check_auth()?;
        self.add_unbound(id, addrs, None)
    }

    fn add_unbound(
        &mut self,
        id: PeerId,
        addrs: Vec<SocketAddr>,
        of_job: Option<(u64, PeerId)>,
    ) -> Result<(), Error> {
        let first = addrs.first().copied();
        self.add_addrs(id, addrs, Vec::new(), of_job)?;
        // `links` connections in all, to the first address (no interfaces to pair here).
        let extra = (self.cfg.wireup.links as usize).clamp(1, MAX_LINKS) - 1;
        let links = first.map_or(Vec::new(), |a| vec![(a, None); extra]);
        self.core.set_link_routes(id, links);
        Ok(())
    }

    fn add_addrs(
        &mut self,
        id: PeerId,
        addrs: Vec<SocketAddr>,
        binds: Vec<Option<SocketAddr>>,
        of_job: Option<(u64, PeerId)>,
    ) -> Result<(), Error> {
        match of_job {
            None => self.core.add_peer_bound(id, addrs, binds),
            Some((job, rank)) => self.core.add_peer_of_job(id, job, rank, addrs, binds),
        }
        .map_err(Error::Send)
    }
}
