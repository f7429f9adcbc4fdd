//! Why a layer could not be built.

use std::fmt;

use crate::{ConfigError, StoreError};

/// Why [`RateLimitLayer::new`](crate::RateLimitLayer::new) or
/// [`RateLimitLayerBuilder`](crate::layer::RateLimitLayerBuilder)
/// failed: the configuration does not fit what the builder was given, or
/// the store cannot be used.
///
/// ```
/// use fleetlimit::{BuildError, Config, RateLimitLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cfg = Config::from_toml_str(r#"
///     [limits.per-tenant]
///     key = "custom:tenant"
///     capacity = 10
///     refill = "1/s"
/// "#)?;
/// // No extractor named "tenant" was registered with `key_fn`.
/// match RateLimitLayer::new(cfg).await {
///     Err(BuildError::Config(e)) => {
///         assert_eq!(e.line(), Some(3)); // where the key was written
///         assert!(e.message().contains(r#"limit "per-tenant""#));
///     }
///     Err(BuildError::Store(e)) => eprintln!("bad Redis settings: {e}"),
///     Ok(_) => unreachable!(),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuildError {
    /// The configuration asks for something the builder was not given: a
    /// limit keyed by a custom key whose extractor is not registered
    /// (placed `file:line:column` when the configuration came from a file).
    Config(ConfigError),
    /// The store cannot be used (an unusable Redis URL, a TLS file that
    /// cannot be read). A Redis that is down is not an error.
    Store(StoreError),
}

/// The inner error's text as it is: a configuration error still starts with
/// `file:line:column:`, for editors and CI logs to jump to.
impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(e) => e.fmt(f),
            Self::Store(e) => e.fmt(f),
        }
    }
}

/// Transparent: the source is the inner error's (its text is this one's).
impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Config(e) => e.source(),
            Self::Store(e) => e.source(),
        }
    }
}

impl From<ConfigError> for BuildError {
    fn from(e: ConfigError) -> Self {
        Self::Config(e)
    }
}

impl From<StoreError> for BuildError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}
