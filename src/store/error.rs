//! Why a store could not decide.

use std::fmt;

/// Why a store could not decide. The outcome of a timed-out command is
/// unknown: Redis may still have run it.
///
/// ```no_run
/// use fleetlimit::{BuildError, Config, RateLimitLayer};
///
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let cfg = Config::from_toml_file("fleetlimit.toml")?;
/// // Of the store, only an unusable Redis URL fails here: a Redis that is
/// // down is not.
/// if let Err(BuildError::Store(e)) = RateLimitLayer::new(cfg).await {
///     eprintln!("rate limiter not started ({}): {e}", e.reason());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// No answer within the deadline. Redis may have run the check before
    /// its "not after" bound (see `docs/accuracy.md`), never after it.
    Timeout,
    /// Redis answered that it ran the check after its caller's deadline had
    /// passed (a freeze, a stall, a queue in front of Redis): nothing was
    /// charged.
    Late,
    /// Not connected, connection refused or broken.
    Unavailable(String),
    /// Redis answered with an error (script error, cluster error, OOM...).
    Redis(String),
    /// An answer the store did not understand.
    Protocol(String),
    /// Redis is serving, but a command of the script failed on the data or
    /// numbers of this check (a value Redis refuses, a key the scripts could
    /// not repair). The check's key alone is concerned: this never counts
    /// against the store in the circuit breaker.
    Script(String),
    /// Not asked: this process already has as many checks waiting for
    /// Redis as it queues (its own overload, not Redis's), so this one is
    /// decided by the failure policy at once. Never counts against the
    /// store in the circuit breaker.
    Overloaded,
    /// Not asked: the circuit breaker is open after repeated failures.
    CircuitOpen,
}

impl StoreError {
    /// Whether the error says the store is not serving (down, slow, not
    /// understood), as opposed to one check's data ([`Script`](Self::Script))
    /// or this process's own queue ([`Overloaded`](Self::Overloaded)): only
    /// these count toward opening the circuit breaker.
    #[must_use]
    pub fn is_availability(&self) -> bool {
        !matches!(self, Self::Script(_) | Self::Overloaded)
    }

    /// A short label for logs and metrics.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Late => "late",
            Self::Unavailable(_) => "unavailable",
            Self::Redis(_) => "redis-error",
            Self::Protocol(_) => "protocol",
            Self::Script(_) => "script-error",
            Self::Overloaded => "overloaded",
            Self::CircuitOpen => "circuit-open",
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout => f.write_str("no answer within the deadline"),
            Self::Late => f.write_str("Redis ran the check after its deadline and charged nothing"),
            Self::Unavailable(e) => write!(f, "store unavailable: {e}"),
            Self::Redis(e) => write!(f, "redis error: {e}"),
            Self::Protocol(e) => write!(f, "unexpected answer: {e}"),
            Self::Script(e) => write!(f, "script failed on this check's data: {e}"),
            Self::Overloaded => f.write_str(
                "too many checks waiting for Redis in this process: the store was not asked",
            ),
            Self::CircuitOpen => f.write_str("circuit breaker open: the store was not asked"),
        }
    }
}

impl std::error::Error for StoreError {}
