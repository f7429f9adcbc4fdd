//! The Redis store: a pooled `fred` client running the scripts in `lua/`.
//!
//! A request's check is one `EVALSHA` (single token-bucket checks in flight
//! together share one, see `batch.rs`, on a cluster one per primary, see
//! `per_node.rs`; a cluster runs a request's other checks one per hash slot
//! its keys touch, see `cluster.rs`), with a hard deadline,
//! `fail_fast` (a disconnected pool answers at once instead of queueing)
//! and a single attempt. The deadline runs from when the call is handed to
//! fred, not from when the check was queued in this process (see
//! `deadline.rs`); `NOSCRIPT` is recovered inside it (see `script.rs`).
//!
//! A command that timed out may still run on Redis: the caller treats a
//! timeout as "outcome unknown", never as "not charged".
//!
//! - `connect.rs`: fred's configuration, the pool, the first connection.
//! - `deadline.rs`: the deadline of a call, fred's own thread.
//! - `script.rs`: the scripts, `EVALSHA`/`EVAL`, errors and replies.
//! - `batch.rs`: coalesced single-bucket checks.
//! - `lean_call.rs`: one call of such checks, its late answer settled.
//! - `release.rs`: concurrency slots whose release failed, sent again.
//! - `cluster.rs`: a pool per cluster primary.
//! - `per_node.rs`: a Cluster's coalesced checks, a call per primary.
//! - `redirects.rs`: whether a Cluster takes calls across slots, and the
//!   calls that met a slot on the move.
//! - `tls.rs`: `rediss://`.

mod batch;
mod clock;
mod cluster;
pub(crate) mod connect;
mod cross_slot;
mod deadline;
mod lean_call;
mod lease;
mod per_node;
mod redirects;
mod release;
mod release_queue;
pub(crate) mod reply;
pub(crate) mod script;

pub use self::redirects::Redirects;
#[cfg(feature = "tls")]
pub(crate) mod tls;

use std::sync::Arc;
use std::time::Duration;

use fred::clients::Pool;
use fred::interfaces::{ClientLike, ClusterInterface, EventInterface, LuaInterface};

use self::batch::Batcher;
use self::cluster::{NodePools, slot_groups};
use self::connect::{Startup, build_pool, fred_config, wait_connected};
use self::deadline::{IoThread, Stamp, deciding};
use self::reply::map_err;
use self::script::Inner;
use super::{Check, Lease, LeaseFuture, Store, StoreError, StoreFuture};
use crate::algorithm::{LEAN, LEAN_CROSS, LEASE, ONE, SCRIPT};
use crate::config::{Config, RedisSettings, redact_url};

/// Rate-limit state in Redis (standalone, Sentinel or Cluster).
#[derive(Clone)]
pub struct RedisStore {
    pool: Pool,
    /// Where fred's connection tasks run (see `deadline.rs`); `None` on a
    /// pool of the application's own, which runs them where it connected.
    _io: Option<Arc<IoThread>>,
    inner: Arc<Inner>,
    /// Coalesces single-bucket checks (a Cluster's per primary).
    batcher: Option<Batcher>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("pool_size", &self.pool.size())
            .field("deadline", &self.inner.deadline())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to the configuration's Redis (`[redis]`: its URL, TLS,
    /// pool size, timeouts and coalescing) with its deadline per check, as
    /// [`RateLimitLayer::new`](crate::RateLimitLayer::new) does: for a
    /// store of your own around it, given with
    /// [`RateLimitLayer::with_store`](crate::RateLimitLayer::with_store).
    ///
    /// Waits up to `connect_timeout` for the first connection and loads
    /// the scripts; if Redis is not there yet, or refuses the credentials,
    /// that is logged, not an error: the pool keeps reconnecting in the
    /// background and routes use their failure policy meanwhile. Errors
    /// only without a `[redis]` section, for an unusable URL, or outside a
    /// tokio runtime.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use fleetlimit::store::RedisStore;
    /// use fleetlimit::Config;
    ///
    /// let cfg = Config::from_toml_str("[redis]\nurl = \"redis://127.0.0.1:6379\"\n")?;
    /// let store = RedisStore::connect(&cfg).await?;
    /// # let _ = store;
    /// # Ok(()) }
    /// ```
    pub async fn connect(config: &Config) -> Result<Self, StoreError> {
        let settings = config.redis.as_ref().ok_or_else(|| {
            StoreError::Unavailable("the configuration has no [redis] section".into())
        })?;
        let (store, started) = Self::open(settings, settings.pool_size, config.deadline).await?;
        let url = redact_url(&settings.url);
        // fred's error text may quote the URL: its secrets never printed.
        let started = started.map_err(|s| match s {
            Startup::Auth(e) => Startup::Auth(crate::config::redis_url::scrub(&e, &settings.url)),
            Startup::Unreachable(e) => {
                Startup::Unreachable(crate::config::redis_url::scrub(&e, &settings.url))
            }
        });
        match started {
            Ok(()) => {}
            Err(Startup::Auth(e)) => {
                tracing::warn!(target: "fleetlimit", %url, error = %e, "Redis refused the credentials at start (authentication failed); routes use their failure policy until it accepts them")
            }
            Err(Startup::Unreachable(e)) => {
                tracing::warn!(target: "fleetlimit", %url, error = %e, "Redis not reachable at start; routes use their failure policy until it is")
            }
        }
        Ok(store.coalescing(settings))
    }

    /// Builds the pool and waits up to the connect timeout for it; the
    /// second result says how that went (the store is usable either way:
    /// it keeps reconnecting).
    pub(crate) async fn open(
        settings: &RedisSettings,
        pool_size: usize,
        deadline: Duration,
    ) -> Result<(Self, Result<(), Startup>), StoreError> {
        let connect_timeout = settings.connect_timeout;
        let (mut config, tls) = fred_config(settings)?;
        // A Redis that is down at start-up is retried by the reconnect
        // policy, like one that goes down later (fred gives up otherwise).
        config.fail_fast = false;
        let template = config.clone();
        let pool = build_pool(config, pool_size, deadline, connect_timeout)?;
        // Subscribed before connecting: a refused AUTH or a failed TLS
        // handshake shows only there (the pool just keeps reconnecting).
        let errors = pool.next().error_rx();
        let io = IoThread::start()?;
        {
            // fred spawns its connection tasks (and, from them, every
            // reconnection) on the runtime it is called from.
            let _on_io = io.handle.enter();
            let _connection_tasks = pool.connect_pool();
        }
        let handle = io.handle.clone();
        let nodes = pool.is_clustered().then(|| {
            NodePools::new(
                pool.clone(),
                template,
                pool_size,
                deadline,
                connect_timeout,
                handle.clone(),
            )
        });
        let store = Self {
            pool,
            _io: Some(Arc::new(io)),
            inner: Arc::new(Inner::new(handle, nodes, deadline)),
            batcher: None,
        };
        let started = wait_connected(&store.pool, errors, connect_timeout, tls).await;
        if started.is_ok() {
            store.prepare(connect_timeout).await;
        }
        Ok((store, started))
    }

    /// A store on a fred pool of your own, connected (`init`) beforehand:
    /// its checks get the configuration's deadline, `fail_fast` and a
    /// single attempt whatever the pool's own settings, and are coalesced
    /// as `[redis] coalesce` says (on by default).
    ///
    /// Give the pool a reconnect policy (without one it never reconnects
    /// after Redis restarts) and a `default_command_timeout` (the bound of
    /// anything sent without per-call options). Its connection tasks run
    /// where it was connected, not on a thread of their own as with
    /// [`connect`](Self::connect), so a busy application runtime reads
    /// Redis's answers later.
    ///
    /// Loads the scripts (a failure is logged: checks load them again when
    /// Redis lacks them). Errors outside a tokio runtime.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// use fleetlimit::store::RedisStore;
    /// use fleetlimit::{Config, RateLimitLayer};
    /// use fred::prelude::{Builder, ClientLike, Config as FredConfig, ReconnectPolicy};
    ///
    /// # async fn f(config: Config) -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = Builder::from_config(FredConfig::from_url("redis://127.0.0.1:6379")?)
    ///     .with_performance_config(|p| p.default_command_timeout = Duration::from_millis(50))
    ///     .set_policy(ReconnectPolicy::new_exponential(0, 20, 1_000, 2))
    ///     .build_pool(4)?;
    /// pool.init().await?;
    /// let store = RedisStore::from_pool(pool, &config).await?;
    /// let layer = RateLimitLayer::with_store(config, Arc::new(store)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn from_pool(pool: Pool, config: &Config) -> Result<Self, StoreError> {
        let io = tokio::runtime::Handle::try_current().map_err(|e| {
            StoreError::Unavailable(format!("RedisStore::from_pool needs a tokio runtime: {e}"))
        })?;
        let defaults = RedisSettings::default();
        let settings = config.redis.as_ref().unwrap_or(&defaults);
        let nodes = pool.is_clustered().then(|| {
            NodePools::new(
                pool.clone(),
                pool.client_config(),
                pool.size(),
                config.deadline,
                settings.connect_timeout,
                io.clone(),
            )
        });
        let store = Self {
            pool,
            _io: None,
            inner: Arc::new(Inner::new(io, nodes, config.deadline)),
            batcher: None,
        };
        store.prepare(settings.connect_timeout).await;
        Ok(store.coalescing(settings))
    }

    /// Once connected: a cluster's pool per primary, Redis's clock (each
    /// primary's), and the scripts.
    async fn prepare(&self, connect_timeout: Duration) {
        match &self.inner.nodes {
            Some(nodes) => nodes.connect_all(connect_timeout).await,
            None => clock::learn(&self.pool, &self.inner.clock).await,
        }
        let loaded = tokio::time::timeout(connect_timeout, self.load_script()).await;
        if let Err(e) = loaded.unwrap_or(Err(StoreError::Timeout)) {
            tracing::warn!(target: "fleetlimit", error = %e, "could not load the script; EVAL will load it on first use");
        }
    }

    /// `SCRIPT LOAD`s the scripts (on every primary of a cluster); the
    /// check also recovers by itself.
    pub(crate) async fn load_script(&self) -> Result<(), StoreError> {
        for text in [ONE, LEAN, SCRIPT, LEASE] {
            if self.pool.is_clustered() {
                let () = self
                    .pool
                    .next()
                    .script_load_cluster(text)
                    .await
                    .map_err(map_err)?;
            } else {
                let _sha: String = self.pool.script_load(text).await.map_err(map_err)?;
            }
        }
        if self.pool.is_clustered() {
            let loaded: Result<(), _> = self.pool.next().script_load_cluster(LEAN_CROSS).await;
            let e = loaded.err().map(map_err);
            match e {
                Some(e) if redirects::refuses_flag(&e) => self.inner.cross.refuse(&e),
                Some(e) => return Err(e),
                None => {}
            }
        }
        Ok(())
    }

    /// Coalesces concurrent single-bucket checks into one script call when
    /// `[redis] coalesce` says so (see `batch.rs`; on a Cluster one call
    /// per primary, `per_node.rs`), each waiting up to `batch_window` for
    /// company: one batcher, started on the configuration's checked
    /// numbers. Needs a tokio runtime.
    fn coalescing(mut self, settings: &RedisSettings) -> Self {
        self.batcher = settings.coalesce.then(|| {
            Batcher::start(
                self.pool.clone(),
                Arc::clone(&self.inner),
                settings.batch_window,
            )
        });
        self
    }

    /// On a Cluster, the calls that met a slot on the move (`MOVED`, `ASK`,
    /// `TRYAGAIN`...) and how they ended, since the store started: each
    /// was sent again per slot within its deadline, or left to the route's
    /// failure policy. Zeros elsewhere. For tests: operators read
    /// `fleetlimit_cluster_redirects_total` (feature `metrics`).
    #[doc(hidden)]
    #[must_use]
    pub fn redirects(&self) -> Redirects {
        self.inner.cross.redirects()
    }

    /// Takes `error` as a cluster's answer to the script flagged
    /// `allow-cross-slot-keys` (its `SCRIPT LOAD` or `EVAL`): whether it
    /// reads as a refusal of the flag, and if so coalesced checks go in one
    /// call per slot from now on, as when the store meets it itself. For
    /// tests of that fallback: no server at hand refuses the flag.
    #[doc(hidden)]
    pub fn refuse_cross_slot(&self, error: &str) -> bool {
        let e = StoreError::Redis(error.to_owned());
        let refused = redirects::refuses_flag(&e);
        if refused {
            self.inner.cross.refuse(&e);
        }
        refused
    }

    /// The fred pool, for admin tasks and the heartbeat.
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The SHA1 of the decision script (what `EVALSHA` sends for requests
    /// counted against several limits, or against a window): for checking
    /// with `SCRIPT EXISTS` that a Redis holds it.
    #[must_use]
    pub fn script_sha() -> String {
        fred::util::sha1_hash(SCRIPT)
    }

    /// The SHA1 of the lean script (what `EVALSHA` sends for requests
    /// counted against a single token bucket each, decided together in one
    /// call), as [`script_sha`](Self::script_sha).
    #[must_use]
    pub fn lean_script_sha() -> String {
        fred::util::sha1_hash(LEAN)
    }

    /// The SHA1 of the one-check script (what `EVALSHA` sends for a call
    /// that carries a single token-bucket check: a lone request, or a
    /// batch of one), as [`script_sha`](Self::script_sha).
    #[must_use]
    pub fn one_check_script_sha() -> String {
        fred::util::sha1_hash(ONE)
    }

    /// The TAT (µs of Redis's clock) a token bucket's stored value holds,
    /// read as the scripts read it: 8 bytes are a little-endian double
    /// (what they write), anything else decimal text (what earlier
    /// versions wrote). `None`: not a number. For tools and tests that read
    /// a bucket's key themselves; `fleetlimit inspect` shows it decoded.
    #[must_use]
    pub fn read_tat(raw: &[u8]) -> Option<f64> {
        crate::algorithm::stored_number(raw)
    }
}

impl Store for RedisStore {
    fn check(&self, check: &Check) -> StoreFuture {
        if let (Some(batcher), [bucket]) = (&self.batcher, check.buckets.as_slice()) {
            if let Some(args) = bucket.rule.lean_args(check.cost) {
                // No timer per check: the batch's call carries the deadline,
                // counted from when it is handed to fred.
                return batcher.check(bucket, args);
            }
        }
        let pool = self.pool.clone();
        let inner = Arc::clone(&self.inner);
        // Only a cluster cares about slots; standalone is always one call.
        let groups = if pool.is_clustered() {
            slot_groups(check)
        } else {
            Vec::new()
        };
        let check = check.clone();
        Box::pin(async move {
            // One call for the whole request, unless a cluster spreads its
            // keys over several slots (see `slot_groups`).
            let (inner, pool, check, groups) = (&inner, &pool, &check, &groups);
            let run = |stamp: Stamp| async move {
                if groups.len() <= 1 {
                    return inner.run(pool, check, stamp).await;
                }
                inner.run_in_order(pool, check, groups, stamp).await
            };
            // One deadline for the whole check, NOSCRIPT recovery included;
            // a check Redis ran too late (nothing charged) is asked again
            // when there is time, unless an earlier slot's group may stand.
            let timer = inner.metrics.start();
            let once = groups.len() > 1;
            let answer = deciding(run, once, inner.deadline(), &inner.stalls).await;
            inner.metrics.answered(
                timer,
                answer.as_ref().map(|_| ()).map_err(StoreError::reason),
            );
            answer
        })
    }

    fn lease(&self, check: &Check, step: f64) -> LeaseFuture {
        let lean = match check.buckets.as_slice() {
            [b] => b.rule.lean_args(step).filter(|_| step > 0.0),
            _ => None,
        };
        let Some(lean) = lean else {
            // Not one token bucket: all or nothing, as a check.
            let answer = self.check(check);
            let cost = check.cost;
            return Box::pin(
                async move { lease::whole(answer.await?, cost).map(Lease::into_parts) },
            );
        };
        let (pool, inner) = (self.pool.clone(), Arc::clone(&self.inner));
        let check = check.clone();
        Box::pin(async move {
            let run = |stamp: Stamp| inner.lease(&pool, &check, lean, step, stamp);
            let timer = inner.metrics.start();
            let answer = deciding(run, false, inner.deadline(), &inner.stalls).await;
            inner.metrics.answered(
                timer,
                answer.as_ref().map(|_| ()).map_err(StoreError::reason),
            );
            answer.map(Lease::into_parts)
        })
    }

    fn release(&self, key: &str, slot: &str) {
        let (pool, inner) = (self.pool.clone(), Arc::clone(&self.inner));
        let (key, slot) = (key.to_owned(), slot.to_owned());
        let run = async move { inner.release_bounded(&pool, &key, &slot).await };
        // On the caller's runtime when there is one (a response body is
        // dropped on it); else on fred's own (a body dropped elsewhere).
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(run)),
            Err(_) => drop(self.inner.io.spawn(run)),
        }
    }

    fn nodes(&self, check: &Check) -> Vec<String> {
        if !self.pool.is_clustered() {
            return Vec::new();
        }
        // The slot owners in fred's cached cluster state (none yet: the
        // store as a whole).
        let Some(state) = self.pool.next().cached_cluster_state() else {
            return Vec::new();
        };
        let mut nodes: Vec<String> = Vec::with_capacity(1);
        for b in &check.buckets {
            let slot = fred::util::redis_keyslot(b.key.as_bytes());
            if let Some(server) = state.get_server(slot) {
                let name = server.to_string();
                if !nodes.contains(&name) {
                    nodes.push(name);
                }
            }
        }
        nodes
    }
}
