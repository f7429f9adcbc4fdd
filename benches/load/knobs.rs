//! The knobs: the sizes and limits every part of the harness shares.

use std::time::Duration;

use http::header::HeaderName;

/// Keep-alive connections of the load generator.
pub const CONNECTIONS: usize = 64;
/// Not recorded: connections, buckets, script caches and the breaker settle.
pub const WARMUP: Duration = Duration::from_secs(1);
/// Recorded, per run, unless `LOAD_SECS` says otherwise (short enough that
/// a whole run, every scenario included, stays under 6 minutes).
pub const DEFAULT_SECS: f64 = 3.0;
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

/// Open loop: each connection sends at most one request per this interval
/// (more connections for higher rates), so that tokio's 1 ms timer
/// granularity is small beside a connection's interval.
pub const OPEN_LOOP_INTERVAL: Duration = Duration::from_millis(4);
/// Open loop: never fewer connections than the closed loop, never more
/// than this.
pub const OPEN_LOOP_MAX_CONNECTIONS: usize = 512;
/// Open-loop loads, in % of a closed-loop peak.
pub const OPEN_LOOP_PERCENTS: [u32; 2] = [50, 80];
/// Server processes of the fleet scenario.
pub const FLEET_PROCESSES: usize = 4;
/// The seed's fleet load: checks per second across the fleet.
pub const SEED_CHECKS_PER_SEC: f64 = 200_000.0;
/// `redis-benchmark -c 1 -n` of the one-connection Redis round trip.
pub const RTT_CALLS: usize = 20_000;
