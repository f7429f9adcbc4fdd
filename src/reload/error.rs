//! [`ReloadError`]: why a reload was refused.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::changes::Changes;
use crate::config::ConfigError;

/// Why a [`ReloadHandle::reload`](super::ReloadHandle::reload) was refused. The running configuration
/// goes on unchanged.
///
/// ```
/// use fleetlimit::reload::ReloadError;
/// use fleetlimit::{Config, RateLimitLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
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
/// let layer = RateLimitLayer::new(Config::from_toml_str(&toml(10, "/"))?).await?;
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
    /// [`ReloadHandle::max_removed_share`](super::ReloadHandle::max_removed_share) allows: an empty or
    /// half-written file, most likely. [`ReloadHandle::force`](super::ReloadHandle::force) applies it.
    Drastic {
        /// Why, in words.
        why: String,
        /// What it would have changed.
        changes: Box<Changes>,
    },
    /// The file was not read and parsed within
    /// [`ReloadHandle::read_timeout`](super::ReloadHandle::read_timeout) (a FIFO with no writer, a hung
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
