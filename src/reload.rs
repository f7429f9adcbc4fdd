//! Hot reload: a layer's configuration swapped whole, without a restart.
//!
//! The layer holds its [`Limiter`] (routes, policies, and the caches that
//! answer under their numbers) in an [`ArcSwap`]: a request loads it once,
//! in the service's `call`, and keeps that one until its response is over;
//! a reload builds the next one on the same [`Core`] (stores and every
//! bucket in them, breaker, fleet size, shedder, tasks) and swaps it in, so
//! the request after the swap decides under the new numbers.
//!
//! What the core was built from cannot change: a reload that changes it is
//! refused, naming each setting, and the running configuration goes on. So
//! is one that would leave nothing limited, or remove more of the limits
//! and routes than the reload's options allow, unless forced: the marks of
//! an empty or half-written file.
//!
//! A file is read and parsed on a thread of its own, never on the
//! runtime's workers, under a timeout: a configuration path that blocks (a
//! FIFO, a hung network mount) costs that thread, not the service.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::{ArcSwap, Guard};

use crate::config::{redact_url, Config, ConfigError};
use crate::key::SecretOrigin;
use crate::pipeline::{Core, Limiter};
use crate::record::Recorder;
use crate::route::Limit;
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
    reading: Arc<Mutex<Option<Instant>>>,
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

    fn reload(&self, cfg: Config, options: &ReloadOptions) -> Result<Changes, ReloadError> {
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

/// Changes a layer's configuration while it serves
/// ([`RateLimitLayer::reload_handle`](crate::RateLimitLayer::reload_handle)).
/// Cheap to clone; it does not keep the layer alive.
///
/// [`reload`](Self::reload) checks the new configuration against the
/// running one and swaps it in whole, atomically: a request already in
/// flight finishes under the configuration it started with, and every
/// request after `reload` returns is decided under the new one. The
/// builder's plan resolver, cost functions, load signal and refusal hook
/// carry over (a cost function whose route is gone is simply unused).
///
/// Buckets are kept: the stores (Redis, or the in-process store) and the
/// `local` fallback's buckets are the layer's, not the configuration's, and
/// a bucket's key is its prefix, limit name and caller. So a limit whose
/// name and `key` stay the same keeps its callers' state: under new numbers
/// of the same algorithm it is read under the new numbers (a window's count
/// stays, and above a lowered limit refuses until the window ends; a token
/// bucket stays full again at the same moment, so what it holds now follows
/// the new capacity and refill); a limit whose algorithm changed
/// starts every caller afresh, since a state of another algorithm reads as
/// a full bucket; a renamed limit or a new `key` counts in new buckets.
/// Remembered refusals, cached plans and the token leases of limits that
/// changed are dropped (the others' leased tokens, already taken from
/// Redis, go on being spent), so
/// nothing answers under the old numbers.
///
/// A reload that would leave nothing limited, or remove more of the limits
/// and routes than [`ReloadOptions::max_removed_share`] allows, is refused
/// ([`ReloadError::Drastic`]) unless forced; a file is read off the
/// runtime's workers under a timeout ([`reload_file`](Self::reload_file)).
///
/// What the layer's stores and tasks were built from cannot change without
/// a restart: `[redis]` (except `closed_retry_after` and
/// `refused_cache_keys`), its `key_prefix` and `deadline`, the key secret,
/// `[memory] max_keys`, `[breaker]`, `[fleet]` discovery, `[escalation]
/// max_delayed` and `[shedding]`. A reload that changes any of them is
/// refused with [`ReloadError::NeedsRestart`] naming each one, and the
/// running configuration goes on.
///
/// # Example
///
/// ```
/// use fleetlimit::{Config, RateLimitLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let toml = |capacity: u32| format!(r#"
///     [limits.per-key]
///     key = "header:x-api-key"
///     capacity = {capacity}
///     refill = "1/s"
///
///     [[routes]]
///     path = "/"
///     limits = ["per-key"]
/// "#);
/// let layer = RateLimitLayer::new(Config::from_toml_str(&toml(10))?).await?;
/// let reload = layer.reload_handle();
/// // Later, on SIGHUP say: the file is parsed and checked first, so a bad
/// // one never reaches the layer.
/// let changes = reload.reload(Config::from_toml_str(&toml(5))?)?;
/// assert_eq!(changes.limits_changed(), ["per-key"]);
/// println!("reloaded: {changes}");
///
/// // What only a restart can change is refused, and nothing changes.
/// let moved = Config::from_toml_str(&toml(5))?.with_redis_url("redis://10.0.0.7:6379");
/// let err = reload.reload(moved).unwrap_err();
/// assert!(err.to_string().contains("[redis]"), "{err}");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ReloadHandle {
    live: Weak<Live>,
}

impl ReloadHandle {
    pub(crate) fn new(live: &Arc<Live>) -> Self {
        Self {
            live: Arc::downgrade(live),
        }
    }

    /// Swaps `config` in (see [`ReloadHandle`]), returning what changed;
    /// on an error nothing changed. Guarded as
    /// [`ReloadOptions::default`] says: a configuration that would limit
    /// nothing, or remove more than half of the limits and routes, is
    /// refused ([`ReloadError::Drastic`]); [`reload_with`](Self::reload_with)
    /// forces it.
    pub fn reload(&self, config: Config) -> Result<Changes, ReloadError> {
        self.reload_with(config, &ReloadOptions::default())
    }

    /// [`reload`](Self::reload) under `options`' guard (its read settings
    /// and `map` are for files: [`reload_file`](Self::reload_file)).
    pub fn reload_with(
        &self,
        config: Config,
        options: &ReloadOptions,
    ) -> Result<Changes, ReloadError> {
        let live = self.live.upgrade().ok_or(ReloadError::LayerDropped)?;
        live.reload(config, options)
    }

    /// Reads, parses and checks the TOML file at `path`, then reloads it
    /// as [`reload_with`](Self::reload_with) does: the way to reload on
    /// `SIGHUP`. Nothing of it runs on the runtime's workers: the file is
    /// read and parsed on a thread of its own, and the reload waits for it
    /// at most [`read_timeout`](ReloadOptions::read_timeout) (logged
    /// `WARN` when it takes over a second). A read that does not finish is
    /// left to its thread and reported ([`ReloadError::ReadTimeout`]); no
    /// other starts while it lasts ([`ReloadError::StillReading`]), so a
    /// blocked path costs one thread however often it is reloaded.
    ///
    /// A file being written is not taken half-written: a regular file is
    /// read once it has not changed for
    /// [`settle`](ReloadOptions::settle) (its length and modification time
    /// the same before and after the read, and the time that old, or two
    /// reads that far apart alike). Writing the new file beside the old
    /// and renaming it over is still the way to be sure.
    ///
    /// ```
    /// use std::time::Duration;
    /// use fleetlimit::{Config, RateLimitLayer, ReloadError, ReloadOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = std::env::temp_dir().join(format!("fleetlimit-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir)?;
    /// let path = dir.join("limits.toml");
    /// let toml = |capacity: u32| format!(
    ///     "[limits.per-key]\nkey = \"header:x-api-key\"\ncapacity = {capacity}\nrefill = \"1/s\"\n\n\
    ///      [[routes]]\npath = \"/\"\nlimits = [\"per-key\"]\n"
    /// );
    /// std::fs::write(&path, toml(10))?;
    /// let layer = RateLimitLayer::new(Config::from_toml_file(&path)?).await?;
    /// let reload = layer.reload_handle();
    /// let options = ReloadOptions::default().settle(Duration::ZERO);
    ///
    /// std::fs::write(&path, toml(5))?;
    /// let changes = reload.reload_file(&path, &options).await?;
    /// assert_eq!(changes.limits_changed(), ["per-key"]);
    ///
    /// // An empty file limits nothing: refused unless forced.
    /// std::fs::write(&path, "")?;
    /// let err = reload.reload_file(&path, &options).await.unwrap_err();
    /// assert!(matches!(err, ReloadError::Drastic { .. }), "{err}");
    /// reload.reload_file(&path, &options.clone().force(true)).await?;
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reload_file(
        &self,
        path: impl AsRef<Path>,
        options: &ReloadOptions,
    ) -> Result<Changes, ReloadError> {
        let path = path.as_ref().to_path_buf();
        let reading = match self.live.upgrade() {
            Some(live) => Arc::clone(&live.reading),
            None => return Err(ReloadError::LayerDropped),
        };
        {
            let mut r = reading.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(since) = *r {
                return Err(ReloadError::StillReading {
                    path,
                    since: since.elapsed(),
                });
            }
            *r = Some(Instant::now());
        }
        let started = Instant::now();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (thread_path, settle) = (path.clone(), options.settle);
        let give_up = started + options.read_timeout;
        let done = Arc::clone(&reading);
        let spawned = std::thread::Builder::new()
            .name("fleetlimit-reload".into())
            .spawn(move || {
                let read = read_settled(&thread_path, settle, give_up).and_then(|source| {
                    let mut cfg = Config::from_toml_str(&source)
                        .map_err(|e| FileError::Invalid(e.in_file(&thread_path)))?;
                    cfg.file = Some(thread_path.clone());
                    Ok(cfg)
                });
                *done.lock().unwrap_or_else(PoisonError::into_inner) = None;
                let _ = tx.send(read);
            });
        if let Err(e) = spawned {
            *reading.lock().unwrap_or_else(PoisonError::into_inner) = None;
            let e = ConfigError::new(format!("cannot start the thread that reads it: {e}"));
            return Err(ReloadError::Invalid(e.in_file(&path)));
        }
        let read = tokio::time::timeout(options.read_timeout, rx).await;
        let took = started.elapsed();
        if took > SLOW_READ {
            tracing::warn!(
                target: "fleetlimit",
                path = %path.display(),
                took_ms = took.as_millis() as u64,
                "reading the configuration file was slow"
            );
        }
        let cfg = match read {
            Ok(Ok(Ok(cfg))) => cfg,
            Ok(Ok(Err(FileError::Invalid(e)))) => return Err(ReloadError::Invalid(e)),
            Ok(Ok(Err(FileError::Unsettled))) => {
                return Err(ReloadError::Unsettled {
                    path,
                    after: options.read_timeout,
                })
            }
            Ok(Err(_)) => {
                let e = ConfigError::new("the thread reading it stopped without an answer");
                return Err(ReloadError::Invalid(e.in_file(&path)));
            }
            Err(_) => {
                tracing::warn!(
                    target: "fleetlimit",
                    path = %path.display(),
                    timeout_ms = options.read_timeout.as_millis() as u64,
                    "reading the configuration file did not finish in time; the running \
                     configuration is kept"
                );
                return Err(ReloadError::ReadTimeout {
                    path,
                    after: options.read_timeout,
                });
            }
        };
        let cfg = match &options.map {
            Some(map) => map(cfg),
            None => cfg,
        };
        self.reload_with(cfg, options)
    }
}

/// A read over a second is logged.
const SLOW_READ: Duration = Duration::from_secs(1);

/// Why the reading thread gave no configuration.
enum FileError {
    /// Unreadable, or not a valid configuration.
    Invalid(ConfigError),
    /// Still changing when the reload gave up.
    Unsettled,
}

/// The text of the file at `path` once it has stopped changing (see
/// [`ReloadHandle::reload_file`]); a file that is not a regular one (a
/// FIFO) is read once, as it comes.
fn read_settled(path: &Path, settle: Duration, give_up: Instant) -> Result<String, FileError> {
    let unreadable = |e: std::io::Error| {
        FileError::Invalid(
            ConfigError::new(format!("cannot read the configuration: {e}")).in_file(path),
        )
    };
    let mut last: Option<(String, Instant)> = None;
    loop {
        let before = std::fs::metadata(path).map_err(unreadable)?;
        let text = std::fs::read_to_string(path).map_err(unreadable)?;
        if !before.is_file() {
            return Ok(text);
        }
        let after = std::fs::metadata(path).map_err(unreadable)?;
        let same = before.len() == after.len()
            && before.modified().ok() == after.modified().ok()
            && text.len() as u64 == after.len();
        let now = Instant::now();
        if same {
            let age = after
                .modified()
                .ok()
                .and_then(|m| SystemTime::now().duration_since(m).ok())
                .unwrap_or(Duration::ZERO);
            let repeated = last
                .as_ref()
                .is_some_and(|(t, at)| *t == text && now.duration_since(*at) >= settle);
            if age >= settle || repeated {
                return Ok(text);
            }
        }
        if now >= give_up {
            return Err(FileError::Unsettled);
        }
        if last.as_ref().is_none_or(|(t, _)| *t != text) {
            last = Some((text, now));
        }
        // Until the file is `settle` old, or the next read would be a
        // second look that far apart; a changing file is looked at often.
        let wait = if same { settle / 4 } else { settle / 20 };
        std::thread::sleep(wait.max(Duration::from_millis(5)).min(give_up - now));
    }
}

/// How [`ReloadHandle::reload_with`] and [`ReloadHandle::reload_file`]
/// guard a reload and read its file.
///
/// The guard refuses ([`ReloadError::Drastic`]) a configuration that would
/// limit nothing (no route entry and no `[default]` names a limit) where
/// the running one limits something, and one that removes more than
/// [`max_removed_share`](Self::max_removed_share) of the running limits
/// and routes (counted together; 0.5 by default): what an empty or
/// truncated file does. [`force`](Self::force) applies it anyway.
///
/// ```
/// use std::time::Duration;
/// use fleetlimit::ReloadOptions;
///
/// let strict = ReloadOptions::default()
///     .max_removed_share(0.2)
///     .read_timeout(Duration::from_secs(2))
///     .map(|cfg| cfg.with_redis_url("redis://10.0.0.7:6379"));
/// let forced = strict.clone().force(true);
/// # let _ = forced;
/// ```
#[derive(Clone)]
pub struct ReloadOptions {
    read_timeout: Duration,
    settle: Duration,
    max_removed_share: f64,
    force: bool,
    map: Option<Arc<dyn Fn(Config) -> Config + Send + Sync>>,
}

impl Default for ReloadOptions {
    /// A read of at most 5 s, a file unchanged for 1 s, at most half of
    /// the limits and routes removed, not forced.
    fn default() -> Self {
        Self {
            read_timeout: Duration::from_secs(5),
            settle: Duration::from_secs(1),
            max_removed_share: 0.5,
            force: false,
            map: None,
        }
    }
}

impl fmt::Debug for ReloadOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadOptions")
            .field("read_timeout", &self.read_timeout)
            .field("settle", &self.settle)
            .field("max_removed_share", &self.max_removed_share)
            .field("force", &self.force)
            .field("map", &self.map.is_some())
            .finish()
    }
}

impl ReloadOptions {
    /// The longest a file's read and parse may take (5 s by default).
    #[must_use]
    pub fn read_timeout(mut self, timeout: Duration) -> Self {
        self.read_timeout = timeout;
        self
    }

    /// How long a regular file must stay unchanged before it is taken
    /// (1 s by default; zero takes it as it is read).
    #[must_use]
    pub fn settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    /// The largest share (0 to 1) of the running limits and routes a
    /// reload may remove without being forced (0.5 by default; 1 refuses
    /// only a configuration that limits nothing).
    #[must_use]
    pub fn max_removed_share(mut self, share: f64) -> Self {
        self.max_removed_share = if share.is_nan() {
            0.5
        } else {
            share.clamp(0.0, 1.0)
        };
        self
    }

    /// Applies the configuration even if it limits nothing or removes more
    /// than the share allows: the operator means it.
    #[must_use]
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    /// What is done to a file's configuration before it is reloaded (say,
    /// the Redis URL of the environment, as at start-up).
    #[must_use]
    pub fn map(mut self, f: impl Fn(Config) -> Config + Send + Sync + 'static) -> Self {
        self.map = Some(Arc::new(f));
        self
    }

    /// Why going from `old` to `new` needs forcing, if it does.
    fn too_drastic(&self, old: &Config, new: &Config, changes: &Changes) -> Option<String> {
        if new.limits_nothing() && !old.limits_nothing() {
            return Some(
                "the new configuration limits nothing (no [[routes]] entry and no [default] \
                 names a limit)"
                    .into(),
            );
        }
        let before = old.limits.len() + routes(old).len();
        let removed = changes.limits_removed.len() + changes.routes_removed.len();
        if before > 0 && removed as f64 / before as f64 > self.max_removed_share {
            return Some(format!(
                "it removes {removed} of the {before} limits and routes, more than the {}% a \
                 reload may remove unforced",
                crate::algorithm::num(self.max_removed_share * 100.0, 1)
            ));
        }
        None
    }
}

impl fmt::Debug for ReloadHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadHandle")
            .field("layer_alive", &(self.live.strong_count() > 0))
            .finish()
    }
}

/// Why a [`ReloadHandle::reload`] was refused. The running configuration
/// goes on unchanged.
///
/// ```
/// use fleetlimit::{Config, RateLimitLayer, ReloadError};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let toml = |capacity: u32, path: &str| format!(r#"
///     [limits.per-key]
///     key = "header:x-api-key"
///     capacity = {capacity}
///     refill = "1/s"
///
///     [[routes]]
///     path = "{path}"
///     limits = ["per-key"]
/// "#);
/// let layer = RateLimitLayer::in_memory(&Config::from_toml_str(&toml(10, "/"))?);
/// let reload = layer.reload_handle();
/// let bigger = Config::builder().memory_max_keys(1_000).build()?;
/// match reload.reload(bigger) {
///     Err(ReloadError::NeedsRestart(items)) => {
///         assert!(items.iter().any(|i| i.starts_with("[memory] max_keys")), "{items:?}")
///     }
///     other => panic!("{other:?}"),
/// }
/// drop(layer);
/// let again = Config::from_toml_str(&toml(5, "/"))?;
/// assert!(matches!(reload.reload(again), Err(ReloadError::LayerDropped)));
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum ReloadError {
    /// The new configuration changes settings the layer's stores and tasks
    /// were built from, each named as in the TOML file (with the old and
    /// new value where it says something), e.g. `[redis] url`.
    NeedsRestart(Vec<String>),
    /// The new configuration turns decision records on, which starts their
    /// writer task: reload from within a Tokio runtime.
    NoRuntime,
    /// The layer was dropped.
    LayerDropped,
    /// The new configuration could not be read, is not valid (with the
    /// file, line and column), or cannot run on this layer: a limit is
    /// keyed by a custom key no extractor was registered for on the
    /// builder.
    Invalid(ConfigError),
    /// The new configuration would limit nothing where the running one
    /// limits something, or remove more of the limits and routes than
    /// [`ReloadOptions::max_removed_share`] allows: an empty or
    /// half-written file, most likely. [`ReloadOptions::force`] applies it.
    Drastic {
        /// Why, in words.
        why: String,
        /// What it would have changed.
        changes: Box<Changes>,
    },
    /// The file was not read and parsed within
    /// [`ReloadOptions::read_timeout`] (a FIFO with no writer, a hung
    /// mount); its thread is left to finish.
    ReadTimeout {
        /// The file.
        path: PathBuf,
        /// The timeout.
        after: Duration,
    },
    /// An earlier read of a file has not finished yet (see
    /// [`ReadTimeout`](Self::ReadTimeout)): none is started beside it.
    StillReading {
        /// The file this reload was to read.
        path: PathBuf,
        /// How long the earlier read has been going on.
        since: Duration,
    },
    /// The file kept changing until the read timeout: being written.
    Unsettled {
        /// The file.
        path: PathBuf,
        /// The timeout.
        after: Duration,
    },
}

impl fmt::Display for ReloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NeedsRestart(items) => write!(
                f,
                "only a restart can change {}; the running configuration is kept",
                items.join(", ")
            ),
            Self::NoRuntime => f.write_str(
                "`record` starts the decision recorder's task: reload from within a Tokio runtime; \
                 the running configuration is kept",
            ),
            Self::LayerDropped => f.write_str("the layer this handle reloads was dropped"),
            Self::Invalid(e) => write!(f, "{e}; the running configuration is kept"),
            Self::Drastic { why, changes } => write!(
                f,
                "refusing to reload: {why} ({changes}); an empty or half-written file? \
                 Force the reload if this is meant; the running configuration is kept"
            ),
            Self::ReadTimeout { path, after } => write!(
                f,
                "{}: not read within {} (a FIFO, or a hung mount?); the running \
                 configuration is kept",
                path.display(),
                crate::algorithm::duration_text(*after)
            ),
            Self::StillReading { path, since } => write!(
                f,
                "{}: an earlier read of the configuration has not finished after {}; \
                 the running configuration is kept",
                path.display(),
                crate::algorithm::duration_text(Duration::from_millis(since.as_millis() as u64))
            ),
            Self::Unsettled { path, after } => write!(
                f,
                "{}: the file kept changing for {} (still being written?); the running \
                 configuration is kept",
                path.display(),
                crate::algorithm::duration_text(*after)
            ),
        }
    }
}

impl std::error::Error for ReloadError {}

/// The settings `new` changes that a reload cannot, each named as in the
/// TOML file.
fn fixed_changes(old: &Config, new: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let mut differ = |name: &str, changed: bool| {
        if changed {
            out.push(name.to_owned());
        }
    };
    match (&old.redis, &new.redis) {
        (None, None) => {}
        (Some(_), None) => differ("[redis] (removed: the layer stays on Redis)", true),
        (None, Some(_)) => differ("[redis] (added: the layer stays on its store)", true),
        (Some(a), Some(b)) => {
            if a.url != b.url {
                let url = format!(
                    "[redis] url ({} → {})",
                    redact_url(&a.url),
                    redact_url(&b.url)
                );
                differ(&url, true);
            }
            let pool = format!("[redis] pool_size ({} → {})", a.pool_size, b.pool_size);
            differ(&pool, a.pool_size != b.pool_size);
            differ(
                "[redis] connect_timeout",
                a.connect_timeout != b.connect_timeout,
            );
            differ("[redis] coalesce", a.coalesce != b.coalesce);
            differ("[redis] tls_ca_file", a.tls_ca_file != b.tls_ca_file);
            differ(
                "[redis] tls_client_cert",
                a.tls_client_cert != b.tls_client_cert,
            );
            differ(
                "[redis] tls_client_key",
                a.tls_client_key != b.tls_client_key,
            );
        }
    }
    differ("[redis] deadline", old.deadline != new.deadline);
    let prefix = format!(
        "[redis] key_prefix ({:?} → {:?})",
        old.key_prefix, new.key_prefix
    );
    differ(&prefix, old.key_prefix != new.key_prefix);
    // The built-in secret follows the prefix, already named.
    let built_in = |c: &Config| *c.key_secret.origin() == SecretOrigin::Default;
    let both_built_in = built_in(old) && built_in(new);
    differ(
        "[keys] secret_env (the key secret)",
        !both_built_in && !old.key_secret.same_keys_as(&new.key_secret),
    );
    let max_keys = format!(
        "[memory] max_keys ({} → {})",
        old.memory_max_keys, new.memory_max_keys
    );
    differ(&max_keys, old.memory_max_keys != new.memory_max_keys);
    differ("[breaker]", old.breaker != new.breaker);
    differ(
        "[fleet] discover, heartbeat, dead_after",
        old.heartbeat != new.heartbeat,
    );
    let delayed = format!(
        "[escalation] max_delayed ({} → {})",
        old.max_delayed, new.max_delayed
    );
    differ(&delayed, old.max_delayed != new.max_delayed);
    differ("[shedding]", old.shedding != new.shedding);
    out
}

/// What a reload changed, for logs: limits and routes added, removed or
/// changed, and other settings that changed. Its `Display` is one line.
///
/// Routes are named by their methods and path (`GET /search`, `* /admin`,
/// and `[default]` for the default policy).
///
/// ```
/// use fleetlimit::{Config, RateLimitLayer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let toml = |capacity: u32, path: &str| format!(r#"
///     [limits.per-key]
///     key = "header:x-api-key"
///     capacity = {capacity}
///     refill = "1/s"
///
///     [[routes]]
///     path = "{path}"
///     limits = ["per-key"]
/// "#);
/// let layer = RateLimitLayer::in_memory(&Config::from_toml_str(&toml(10, "/"))?);
/// let changes = layer.reload_handle().reload(Config::from_toml_str(&toml(5, "/v2"))?)?;
/// assert_eq!(changes.limits_changed(), ["per-key"]);
/// assert_eq!(changes.routes_added(), ["* /v2"]);
/// assert_eq!(changes.routes_removed(), ["* /"]);
/// assert!(!changes.is_empty());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Changes {
    limits_added: Vec<String>,
    limits_removed: Vec<String>,
    limits_changed: Vec<String>,
    limits_restarted: Vec<String>,
    routes_added: Vec<String>,
    routes_removed: Vec<String>,
    routes_changed: Vec<String>,
    settings_changed: Vec<String>,
}

impl Changes {
    /// Limits the new configuration adds.
    #[must_use]
    pub fn limits_added(&self) -> &[String] {
        &self.limits_added
    }

    /// Limits it no longer has (their buckets expire unused).
    #[must_use]
    pub fn limits_removed(&self) -> &[String] {
        &self.limits_removed
    }

    /// Limits whose settings changed (numbers, key, algorithm, plans...).
    #[must_use]
    pub fn limits_changed(&self) -> &[String] {
        &self.limits_changed
    }

    /// Of the changed limits, those whose callers start afresh: their
    /// `key` or algorithm changed, so what was counted no longer applies.
    #[must_use]
    pub fn limits_restarted(&self) -> &[String] {
        &self.limits_restarted
    }

    /// Routes the new configuration adds.
    #[must_use]
    pub fn routes_added(&self) -> &[String] {
        &self.routes_added
    }

    /// Routes it no longer has.
    #[must_use]
    pub fn routes_removed(&self) -> &[String] {
        &self.routes_removed
    }

    /// Routes whose policy changed (limits, cost, failure policy...).
    #[must_use]
    pub fn routes_changed(&self) -> &[String] {
        &self.routes_changed
    }

    /// Other settings that changed, named as in the TOML file
    /// (`[client_ip]`, `[headers] style`...).
    #[must_use]
    pub fn settings_changed(&self) -> &[String] {
        &self.settings_changed
    }

    /// Whether the new configuration is the running one.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    fn between(old: &Config, new: &Config) -> Self {
        let mut c = Self::default();
        let limits = |cfg: &Config| -> BTreeMap<String, Arc<Limit>> {
            cfg.limits
                .iter()
                .map(|l| (l.name.to_string(), Arc::clone(l)))
                .collect()
        };
        let (a, b) = (limits(old), limits(new));
        for (name, l) in &b {
            match a.get(name) {
                None => c.limits_added.push(name.clone()),
                Some(was) if signature(was) != signature(l) => {
                    c.limits_changed.push(name.clone());
                    let algorithm = std::mem::discriminant(&was.rule);
                    if was.key != l.key || algorithm != std::mem::discriminant(&l.rule) {
                        c.limits_restarted.push(name.clone());
                    }
                }
                Some(_) => {}
            }
        }
        c.limits_removed = a.keys().filter(|n| !b.contains_key(*n)).cloned().collect();

        let (a, b) = (routes(old), routes(new));
        for (name, policy) in &b {
            match a.get(name) {
                None => c.routes_added.push(name.clone()),
                Some(was) if was != policy => c.routes_changed.push(name.clone()),
                Some(_) => {}
            }
        }
        c.routes_removed = a.keys().filter(|n| !b.contains_key(*n)).cloned().collect();

        let mut differ = |name: &str, changed: bool| {
            if changed {
                c.settings_changed.push(name.to_owned());
            }
        };
        differ("[client_ip]", old.client_ip != new.client_ip);
        differ("[headers] style", old.header_style != new.header_style);
        differ(
            "[keys] www_authenticate",
            old.www_authenticate != new.www_authenticate,
        );
        differ(
            "[plan_assignments]",
            old.plan_assignments != new.plan_assignments,
        );
        differ(
            "[plan_cache]",
            (old.plan_cache_ttl, old.plan_cache_keys) != (new.plan_cache_ttl, new.plan_cache_keys),
        );
        differ(
            "[redis] closed_retry_after",
            old.closed_retry_after != new.closed_retry_after,
        );
        differ(
            "[redis] refused_cache_keys",
            old.refused_cache_keys != new.refused_cache_keys,
        );
        // With discovery on, the heartbeat's count stands: not a change.
        differ(
            "[fleet] size",
            new.heartbeat.is_none() && old.fleet_size != new.fleet_size,
        );
        c
    }
}

/// Everything a limit is configured with, comparable: its words, and its
/// numbers exactly (the words round a rate to how a person writes it).
fn signature(l: &Limit) -> String {
    let mut plans: Vec<_> = l.plans.iter().collect();
    plans.sort_by(|a, b| a.0.cmp(b.0));
    format!(
        "{}; lease {:?}; {:?}; {plans:?}",
        l.describe(),
        l.lease,
        l.rule
    )
}

/// Each route entry's policy by `<methods> <path>`, and the default one.
fn routes(cfg: &Config) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = cfg
        .routes
        .iter()
        .map(|r| {
            let methods = r.methods.as_ref().map_or_else(
                || "*".to_owned(),
                |m| {
                    m.iter()
                        .map(http::Method::as_str)
                        .collect::<Vec<_>>()
                        .join(",")
                },
            );
            (format!("{methods} {}", r.path), r.policy.describe())
        })
        .collect();
    if let Some(p) = &cfg.default_route {
        out.insert("[default]".to_owned(), p.describe());
    }
    out
}

impl fmt::Display for Changes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("nothing changed");
        }
        let restarted: BTreeSet<&String> = self.limits_restarted.iter().collect();
        let changed: Vec<String> = self
            .limits_changed
            .iter()
            .map(|n| match restarted.contains(n) {
                true => format!("{n} (key or algorithm changed: counted afresh)"),
                false => n.clone(),
            })
            .collect();
        let parts = [
            ("limits added", &self.limits_added),
            ("limits removed", &self.limits_removed),
            ("limits changed", &changed),
            ("routes added", &self.routes_added),
            ("routes removed", &self.routes_removed),
            ("routes changed", &self.routes_changed),
            ("settings changed", &self.settings_changed),
        ];
        let mut first = true;
        for (what, names) in parts {
            if names.is_empty() {
                continue;
            }
            if !first {
                f.write_str("; ")?;
            }
            first = false;
            write!(f, "{what}: {}", names.join(", "))?;
        }
        Ok(())
    }
}
