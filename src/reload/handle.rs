//! [`ReloadHandle`]: a reload from a `Config` or a file (read on a thread of
//! its own, under a timeout, once settled), under the handle's guard.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime};

use super::changes::Changes;
use super::error::ReloadError;
use super::live::Live;
use super::options::Options;
use crate::config::{Config, ConfigError};

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
/// The handle guards each reload: it refuses ([`ReloadError::Drastic`]) a
/// configuration that would limit nothing (no route entry and no
/// `[default]` names a limit) where the running one limits something, and
/// one that removes more than [`max_removed_share`](Self::max_removed_share)
/// of the running limits and routes (counted together; 0.5 by default):
/// what an empty or truncated file does. [`force`](Self::force) applies it
/// anyway. A file is read off the runtime's workers under a timeout
/// ([`reload_file`](Self::reload_file)). The guard's settings are the
/// handle's own: a clone set otherwise leaves this one as it is.
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
/// let smaller = Config::from_toml_str(&format!("[memory]\nmax_keys = 5\n{}", toml(5)))?;
/// let err = reload.reload(smaller).unwrap_err();
/// assert!(err.to_string().contains("[memory] max_keys"), "{err}");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ReloadHandle {
    live: Weak<Live>,
    options: Options,
}

impl ReloadHandle {
    pub(crate) fn new(live: &Arc<Live>) -> Self {
        Self {
            live: Arc::downgrade(live),
            options: Options::default(),
        }
    }

    /// Swaps `config` in (see [`ReloadHandle`]), returning what changed;
    /// on an error nothing changed. Guarded as the handle says (by
    /// default: a configuration that would limit nothing, or remove more
    /// than half of the limits and routes, is refused,
    /// [`ReloadError::Drastic`]); the file settings and [`map`](Self::map)
    /// are [`reload_file`](Self::reload_file)'s.
    pub fn reload(&self, config: Config) -> Result<Changes, ReloadError> {
        let live = self.live.upgrade().ok_or(ReloadError::LayerDropped)?;
        live.reload(config, &self.options)
    }

    /// Reads, parses and checks the TOML file at `path`, then reloads it
    /// as [`reload`](Self::reload) does: the way to reload on
    /// `SIGHUP`. Nothing of it runs on the runtime's workers: the file is
    /// read and parsed on a thread of its own, and the reload waits for it
    /// at most [`read_timeout`](Self::read_timeout) (logged
    /// `WARN` when it takes over a second). A read that does not finish is
    /// left to its thread and reported ([`ReloadError::ReadTimeout`]); no
    /// other starts while it lasts ([`ReloadError::StillReading`]), so a
    /// blocked path costs one thread however often it is reloaded.
    ///
    /// A file being written is not taken half-written: a regular file is
    /// read once it has not changed for
    /// [`settle`](Self::settle) (its length and modification time
    /// the same before and after the read, and the time that old, or two
    /// reads that far apart alike). Writing the new file beside the old
    /// and renaming it over is still the way to be sure.
    ///
    /// ```
    /// use std::time::Duration;
    /// use fleetlimit::reload::ReloadError;
    /// use fleetlimit::{Config, RateLimitLayer};
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
    /// let reload = layer.reload_handle().settle(Duration::ZERO);
    ///
    /// std::fs::write(&path, toml(5))?;
    /// let changes = reload.reload_file(&path).await?;
    /// assert_eq!(changes.limits_changed(), ["per-key"]);
    ///
    /// // An empty file limits nothing: refused unless forced.
    /// std::fs::write(&path, "")?;
    /// let err = reload.reload_file(&path).await.unwrap_err();
    /// assert!(matches!(err, ReloadError::Drastic { .. }), "{err}");
    /// reload.clone().force(true).reload_file(&path).await?;
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reload_file(&self, path: impl AsRef<Path>) -> Result<Changes, ReloadError> {
        let options = &self.options;
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
                });
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
            Some(map) => map(cfg).map_err(ReloadError::Invalid)?,
            None => cfg,
        };
        self.reload(cfg)
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

impl ReloadHandle {
    /// The longest a file's read and parse may take (5 s by default).
    #[must_use]
    pub fn read_timeout(mut self, timeout: Duration) -> Self {
        self.options.read_timeout = timeout;
        self
    }

    /// How long a regular file must stay unchanged before it is taken
    /// (1 s by default; zero takes it as it is read).
    #[must_use]
    pub fn settle(mut self, settle: Duration) -> Self {
        self.options.settle = settle;
        self
    }

    /// The largest share (0 to 1) of the running limits and routes a
    /// reload may remove without being forced (0.5 by default; 1 refuses
    /// only a configuration that limits nothing).
    #[must_use]
    pub fn max_removed_share(mut self, share: f64) -> Self {
        self.options.max_removed_share = if share.is_nan() {
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
        self.options.force = force;
        self
    }

    /// What makes the configuration to reload from the file's (say, the
    /// file's on the Redis URL of the environment, as at start-up, with
    /// [`Config::try_with_redis_url`]). Its error refuses the reload
    /// ([`ReloadError::Invalid`]), as an error in the file does.
    #[must_use]
    pub fn map(
        mut self,
        f: impl Fn(Config) -> Result<Config, ConfigError> + Send + Sync + 'static,
    ) -> Self {
        self.options.map = Some(Arc::new(f));
        self
    }
}

impl fmt::Debug for ReloadHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        f.debug_struct("ReloadHandle")
            .field("layer_alive", &(self.live.strong_count() > 0))
            .field("read_timeout", &o.read_timeout)
            .field("settle", &o.settle)
            .field("max_removed_share", &o.max_removed_share)
            .field("force", &o.force)
            .field("map", &o.map.is_some())
            .finish()
    }
}
