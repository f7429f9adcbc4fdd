//! On a Redis Cluster, a pool of connections per primary for the checks.
//!
//! fred's cluster client reconnects as a whole: when one primary dies, its
//! every resync fails on that node, and every slot's commands fail with it
//! until the node is back. So checks do not go through it: each primary
//! (by `host:port`) gets a plain pool of its own, made when the store
//! connects or when a check first goes there, and routed by the slot
//! table fred's cluster client keeps (its last good one while it cannot
//! resync). A dead primary's pool fails fast and reconnects by itself; the
//! others never notice. A `MOVED` answer (a slot moved since the table
//! was read) is followed once, to the node it names, and has fred read the
//! table again; an `ASK` (a slot being moved) is followed once with
//! `ASKING`. A check whose keys span several slots is split by slot
//! (`slot_groups`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fred::clients::Pool;
use fred::error::Error as FredError;
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::config::{Config as FredConfig, ServerConfig};

use super::clock::RedisClock;
use super::connect::build_pool;
use crate::store::{Check, StoreError};

/// Most primaries with a pool (Redis Cluster's own limit is about a
/// thousand nodes); beyond it a check is refused as unavailable.
const MAX_NODES: usize = 1_024;

/// Least time between two reads of the slot table after `MOVED`s (a
/// reshard of a thousand slots sends many at once).
const RESYNC_EVERY: Duration = Duration::from_millis(100);

pub(crate) struct NodePools {
    /// fred's cluster client: only its slot table is used here.
    cluster: Pool,
    /// The cluster's URL settings (credentials, database), for each node.
    template: FredConfig,
    pool_size: usize,
    deadline: Duration,
    connect_timeout: Duration,
    io: tokio::runtime::Handle,
    pools: Mutex<HashMap<String, Node>>,
    /// When the slot table was last read again (ms since `born`, plus one).
    resynced: AtomicU64,
    born: Instant,
}

/// A primary's pool, and its clock (each primary's host has its own).
#[derive(Clone)]
pub(crate) struct Node {
    pub(crate) pool: Pool,
    pub(crate) clock: Arc<RedisClock>,
}

impl NodePools {
    pub(crate) fn new(
        cluster: Pool,
        template: FredConfig,
        pool_size: usize,
        deadline: Duration,
        connect_timeout: Duration,
        io: tokio::runtime::Handle,
    ) -> Self {
        Self {
            cluster,
            template,
            pool_size,
            deadline,
            connect_timeout,
            io,
            pools: Mutex::new(HashMap::new()),
            resynced: AtomicU64::new(0),
            born: Instant::now(),
        }
    }

    /// fred's slot table now (one copy, for a batch's every check).
    pub(crate) fn table(&self) -> Option<fred::types::cluster::ClusterRouting> {
        self.cluster.next().cached_cluster_state()
    }

    /// Has every client of fred's cluster pool read the slot table again
    /// (each keeps its own), at most once per [`RESYNC_EVERY`], in the
    /// background.
    pub(crate) fn resync(&self) {
        let now = self.born.elapsed().as_millis() as u64 + 1;
        let last = self.resynced.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= RESYNC_EVERY.as_millis() as u64;
        if !due
            || self
                .resynced
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let cluster = self.cluster.clone();
        drop(self.io.spawn(async move {
            for client in cluster.clients() {
                if let Err(e) = client.sync_cluster().await {
                    tracing::debug!(target: "fleetlimit", error = %e, "could not read the cluster's slot table again");
                }
            }
        }));
    }

    /// The primary owning `slot`, as `host:port`, from fred's slot table.
    pub(crate) fn owner(&self, slot: u16) -> Option<(String, u16)> {
        let state = self.cluster.next().cached_cluster_state()?;
        let server = state.get_server(slot)?;
        Some((server.host.to_string(), server.port))
    }

    /// The primary owning `slot`.
    pub(crate) fn for_slot(&self, slot: u16) -> Result<Node, StoreError> {
        let (host, port) = self
            .owner(slot)
            .ok_or_else(|| StoreError::Unavailable("cluster slots not known yet".into()))?;
        self.pool(&host, port)
    }

    /// The node at `host:port`, its pool made (and connecting) if new.
    pub(crate) fn pool(&self, host: &str, port: u16) -> Result<Node, StoreError> {
        let name = format!("{host}:{port}");
        let mut pools = crate::sync::lock(&self.pools);
        if let Some(node) = pools.get(&name) {
            return Ok(node.clone());
        }
        if pools.len() >= MAX_NODES {
            return Err(StoreError::Unavailable(format!(
                "more than {MAX_NODES} cluster nodes"
            )));
        }
        let mut config = self.template.clone();
        config.server = ServerConfig::new_centralized(host, port);
        let pool = build_pool(config, self.pool_size, self.deadline, self.connect_timeout)?;
        {
            let _on_io = self.io.enter();
            let _connection_tasks = pool.connect_pool();
        }
        let node = Node {
            pool,
            clock: Arc::new(RedisClock::new()),
        };
        pools.insert(name, node.clone());
        Ok(node)
    }

    /// Pools for every primary fred knows now, waiting (at most `within`)
    /// for them to connect.
    pub(crate) async fn connect_all(&self, within: Duration) {
        let Some(state) = self.cluster.next().cached_cluster_state() else {
            return;
        };
        let nodes: Vec<Node> = state
            .unique_primary_nodes()
            .iter()
            .filter_map(|server| self.pool(&server.host, server.port).ok())
            .collect();
        // One wait for all: a primary that is down costs `within` once.
        let _ = tokio::time::timeout(within, async {
            for node in &nodes {
                if node.pool.wait_for_connect().await.is_ok() {
                    super::clock::learn(&node.pool, &node.clock).await;
                }
            }
        })
        .await;
    }
}

/// Indexes of the check's buckets, grouped by cluster slot in the route's
/// order.
pub(crate) fn slot_groups(check: &Check) -> Vec<Vec<usize>> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, b) in check.buckets.iter().enumerate() {
        let slot = fred::util::redis_keyslot(b.key.as_bytes());
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, g)) => g.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// The node a `MOVED` error names, as `(host, port)`.
pub(crate) fn moved_to(e: &FredError) -> Option<(String, u16)> {
    named(e.details().strip_prefix("MOVED ")?)
}

/// The node an `ASK` error names (the slot is being moved there), as
/// `(host, port)`.
pub(crate) fn asked_to(e: &FredError) -> Option<(String, u16)> {
    named(e.details().strip_prefix("ASK ")?)
}

/// `host:port` after the slot in a redirection.
fn named(rest: &str) -> Option<(String, u16)> {
    let addr = rest.split_whitespace().nth(1)?;
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use fred::error::ErrorKind;

    use super::*;

    #[test]
    fn moved_names_its_node() {
        let e = FredError::new(ErrorKind::Cluster, "MOVED 3999 127.0.0.1:6381");
        assert_eq!(moved_to(&e), Some(("127.0.0.1".to_owned(), 6381)));
        let e = FredError::new(ErrorKind::Cluster, "CLUSTERDOWN The cluster is down");
        assert_eq!(moved_to(&e), None);
        let e = FredError::new(ErrorKind::Cluster, "ASK 3999 127.0.0.1:6382");
        assert_eq!(asked_to(&e), Some(("127.0.0.1".to_owned(), 6382)));
        assert_eq!(moved_to(&e), None);
    }
}
