//! What a layer's clones share: the running limiter, swapped whole by a
//! reload, and the core it runs on.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use arc_swap::{ArcSwap, Guard};

use super::changes::{Changes, fixed_changes};
use super::error::ReloadError;
use super::options::Options;
use crate::config::Config;
use crate::pipeline::{Core, Limiter};
use crate::record::Recorder;
#[cfg(feature = "redis")]
use crate::store::RedisStore;

/// What a layer's clones share: the configuration running now, and the
/// core every configuration of the layer runs on.
pub(crate) struct Live {
    core: Arc<Core>,
    current: ArcSwap<Limiter>,
    /// The configuration `current` was built from, for the next reload to
    /// compare with. Locked for a whole reload: reloads happen one at a time.
    config: Mutex<Config>,
    /// The configuration's Redis, when the layer decides on it (a reload
    /// that turns `record` on starts the recorder there).
    redis: Option<OwnRedis>,
    /// A file read still under way on its thread, and since when: a read
    /// that blocks is not started again while it lasts (one thread at most).
    pub(super) reading: Arc<Mutex<Option<Instant>>>,
}

/// The layer's own Redis store and the instance id its records carry.
#[cfg(feature = "redis")]
#[derive(Clone)]
pub(crate) struct OwnRedis {
    pub(crate) store: RedisStore,
    pub(crate) instance: Arc<str>,
}

/// A build without Redis has no store of its own: never made.
#[cfg(not(feature = "redis"))]
#[derive(Clone)]
pub(crate) enum OwnRedis {}

impl Live {
    pub(crate) fn new(limiter: Limiter, config: Config, redis: Option<OwnRedis>) -> Arc<Self> {
        Arc::new(Self {
            core: Arc::clone(limiter.core()),
            current: ArcSwap::from_pointee(limiter),
            config: Mutex::new(config),
            redis,
            reading: Arc::new(Mutex::new(None)),
        })
    }

    /// The limiter of the running configuration (one atomic load).
    #[inline]
    pub(crate) fn load(&self) -> Guard<Arc<Limiter>> {
        self.current.load()
    }

    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    pub(super) fn reload(&self, cfg: Config, options: &Options) -> Result<Changes, ReloadError> {
        let mut running = self.config.lock().unwrap_or_else(PoisonError::into_inner);
        // The same check as the layer's build: a custom key needs its
        // extractor, registered on the builder (which a reload cannot add).
        let current = self.current.load();
        cfg.check_custom_keys(|name| current.may_key_by(name))
            .map_err(ReloadError::Invalid)?;
        let fixed = fixed_changes(&running, &cfg);
        if !fixed.is_empty() {
            return Err(ReloadError::NeedsRestart(fixed));
        }
        let changes = Changes::between(&running, &cfg);
        if !options.force {
            if let Some(why) = options.too_drastic(&running, &cfg, &changes) {
                return Err(ReloadError::Drastic {
                    why,
                    changes: Box::new(changes),
                });
            }
        }
        if !self.core.records() {
            let records = cfg.limits.iter().any(|l| l.record.is_some());
            if records && self.redis.is_some() && tokio::runtime::Handle::try_current().is_err() {
                return Err(ReloadError::NoRuntime);
            }
            if let Some(r) = start_recorder(&cfg, self.redis.as_ref()) {
                self.core.set_recorder(r);
            }
        }
        // A discovered fleet size is the heartbeat's to keep.
        if cfg.heartbeat.is_none() {
            self.core.set_fleet_size(cfg.fleet_size);
        }
        let next = Limiter::on(Arc::clone(&self.core), &cfg);
        self.current.store(Arc::new(next));
        // Leased tokens are already taken from Redis: those of unchanged
        // limits go on being spent; a changed limit's would be spent under
        // its old numbers.
        let gone: BTreeSet<&str> = (changes.limits_changed.iter())
            .chain(&changes.limits_removed)
            .chain(&changes.limits_restarted)
            .map(String::as_str)
            .collect();
        if !gone.is_empty() {
            self.core.keep_leases(|limit| !gone.contains(limit));
        }
        *running = cfg;
        Ok(changes)
    }
}

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Live")
            .field("limiter", &**self.current.load())
            .finish_non_exhaustive()
    }
}

/// Starts the decision recorder when some limit of `cfg` records and the
/// layer decides on the configuration's Redis; says so when it does not.
pub(crate) fn start_recorder(cfg: &Config, redis: Option<&OwnRedis>) -> Option<Recorder> {
    if !cfg.limits.iter().any(|l| l.record.is_some()) {
        return None;
    }
    match redis {
        #[cfg(not(feature = "redis"))]
        Some(r) => match *r {},
        #[cfg(feature = "redis")]
        Some(r) => Some(Recorder::start(
            r.store.clone(),
            Arc::clone(&cfg.key_prefix),
            Arc::clone(&r.instance),
            cfg.deadline,
        )),
        None => {
            tracing::warn!(
                target: "fleetlimit",
                "`record` is set but the store is not the configuration's Redis: \
                 no decision is recorded"
            );
            None
        }
    }
}
