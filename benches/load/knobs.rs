//! The knobs: the sizes and limits every part of the harness shares.

use std::time::Duration;

use http::header::HeaderName;

/// Keep-alive connections of the load generator.
pub const CONNECTIONS: usize = 64;
/// Not recorded: connections, buckets, script caches and the breaker settle.
pub const WARMUP: Duration = Duration::from_secs(1);
/// Recorded, per run, unless `LOAD_SECS` says otherwise.
pub const DEFAULT_SECS: f64 = 5.0;
/// Rounds per scenario, alternating the order of the contenders.
pub const ROUNDS: usize = 2;
/// One request that takes longer than this counts as an error and its
/// connection is replaced (nothing here should come close).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Distinct API keys of ordinary callers.
pub const NORMAL_KEYS: usize = 10_000;
/// Distinct API keys of the abusers.
pub const ABUSERS: usize = 50;
/// Percentage of requests sent by the abusers in the abuse scenario.
pub const ABUSE_PERCENT: u64 = 90;

/// `[redis] pool_size` of fleetlimit and the size of the peer's fred pool.
pub const POOL_SIZE: usize = 4;
/// fleetlimit's `[redis] deadline` and the peer's `default_command_timeout`
/// in the normal and abuse scenarios.
pub const DEADLINE_MS: u64 = 50;

pub static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
