//! How a [`ReloadHandle`](super::ReloadHandle) guards a reload and reads
//! its file: the settings its builder methods set, and the guard itself.

use std::sync::Arc;
use std::time::Duration;

use super::changes::{Changes, routes};
use crate::config::{Config, ConfigError};

/// [`ReloadHandle::map`]'s function.
type MapFn = dyn Fn(Config) -> Result<Config, ConfigError> + Send + Sync;

/// How a [`ReloadHandle`] guards a reload and reads its file.
#[derive(Clone)]
pub(super) struct Options {
    pub(super) read_timeout: Duration,
    pub(super) settle: Duration,
    pub(super) max_removed_share: f64,
    pub(super) force: bool,
    pub(super) map: Option<Arc<MapFn>>,
}

impl Default for Options {
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

impl Options {
    /// Why going from `old` to `new` needs forcing, if it does.
    pub(super) fn too_drastic(
        &self,
        old: &Config,
        new: &Config,
        changes: &Changes,
    ) -> Option<String> {
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
