//! The Redis store: a pooled `fred` client running one script per request.
//!
//! Each check is one `EVALSHA` with a hard deadline, `fail_fast` (a
//! disconnected pool answers at once instead of queueing) and a single
//! attempt. It is sent as a custom command because fred 10.1's
//! `with_options(..).evalsha(..)` drops the timeout and fail-fast options.
//! `NOSCRIPT` (Redis restarted, `SCRIPT FLUSH`) is answered by `EVAL`, which
//! also caches the script again, inside the same deadline.
//!
//! A command that timed out may still run on Redis: the caller treats a
//! timeout as "outcome unknown", never as "not charged".

use std::sync::Arc;
use std::time::Duration;

use fred::clients::Pool;
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::{ClientLike, LuaInterface};
use fred::types::config::{Config as FredConfig, Options, ReconnectPolicy};
use fred::types::{Builder, ClusterHash, CustomCommand, Value};
use tokio::time::Instant;

use super::{Check, Store, StoreError, StoreFuture};
use crate::outcome::{LimitState, Outcome};

/// The token bucket script, run by `EVALSHA`.
pub(crate) const TOKEN_BUCKET: &str = include_str!("../../lua/token_bucket.lua");

/// Rate-limit state in Redis (standalone for now).
#[derive(Clone)]
pub struct RedisStore {
    pool: Pool,
    inner: Arc<Inner>,
}

struct Inner {
    sha: Value,
    script: Value,
    deadline: Duration,
    options: Options,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("pool_size", &self.pool.size())
            .field("deadline", &self.inner.deadline)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Builds a pool for `url` and starts connecting. Waits up to
    /// `connect_timeout` for the first connection and loads the script; if
    /// Redis is not there yet, that is logged, not an error: the pool keeps
    /// reconnecting in the background and routes use their failure policy
    /// meanwhile. Errors only for a malformed URL or pool size.
    pub async fn connect(
        url: &str,
        pool_size: usize,
        deadline: Duration,
        connect_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let mut config = FredConfig::from_url(url)
            .map_err(|e| StoreError::Unavailable(format!("bad Redis URL: {e}")))?;
        // A Redis that is down at start-up is retried by the reconnect
        // policy, like one that goes down later (fred gives up otherwise).
        config.fail_fast = false;
        let pool = Builder::from_config(config)
            .with_performance_config(|p| {
                // Safety net for anything sent without per-call options.
                p.default_command_timeout = deadline.max(Duration::from_millis(1));
            })
            .with_connection_config(|c| {
                c.connection_timeout = connect_timeout;
                c.max_command_attempts = 1;
                c.internal_command_timeout = connect_timeout;
            })
            // Without a policy a pool never reconnects after Redis restarts.
            .set_policy(ReconnectPolicy::new_exponential(0, 20, 1_000, 2))
            .build_pool(pool_size.max(1))
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let _connection_tasks = pool.connect_pool();
        let store = Self {
            pool,
            inner: Arc::new(Inner {
                sha: Value::from(fred::util::sha1_hash(TOKEN_BUCKET)),
                script: Value::from(TOKEN_BUCKET),
                deadline,
                options: Options {
                    timeout: Some(deadline),
                    fail_fast: true,
                    max_attempts: Some(1),
                    max_redirections: Some(3),
                    ..Options::default()
                },
            }),
        };
        match tokio::time::timeout(connect_timeout, store.pool.wait_for_connect()).await {
            Ok(Ok(())) => {
                if let Err(e) = store.load_script().await {
                    tracing::warn!(target: "fleetlimit", error = %e, "could not load the script; EVAL will load it on first use");
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(target: "fleetlimit", url, error = %e, "Redis not reachable at start; routes use their failure policy until it is")
            }
            Err(_) => {
                tracing::warn!(target: "fleetlimit", url, "Redis not reachable at start; routes use their failure policy until it is")
            }
        }
        Ok(store)
    }

    /// `SCRIPT LOAD`s the script; the check also recovers by itself.
    pub async fn load_script(&self) -> Result<(), StoreError> {
        let sha: String = self.pool.script_load(TOKEN_BUCKET).await.map_err(map_err)?;
        debug_assert_eq!(Value::from(sha), self.inner.sha);
        Ok(())
    }

    /// The fred pool, for admin tasks and tests.
    #[must_use]
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The SHA1 of the token-bucket script.
    #[must_use]
    pub fn script_sha(&self) -> String {
        fred::util::sha1_hash(TOKEN_BUCKET)
    }
}

impl Store for RedisStore {
    fn check(&self, check: &Check) -> StoreFuture {
        // EVALSHA sha numkeys key.. cost (capacity refill)..
        let n = check.buckets.len();
        let mut args: Vec<Value> = Vec::with_capacity(3 + 3 * n);
        args.push(self.inner.sha.clone());
        args.push(Value::Integer(n as i64));
        args.extend(check.buckets.iter().map(|b| Value::from(b.key.as_str())));
        args.push(Value::from(check.cost.to_string()));
        for b in &check.buckets {
            args.push(Value::from(b.capacity.to_string()));
            args.push(Value::from(b.refill_per_sec.to_string()));
        }
        let capacities: Vec<f64> = check.buckets.iter().map(|b| b.capacity).collect();
        let pool = self.pool.clone();
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let started = Instant::now();
            let run = async {
                let evalsha = CustomCommand::new_static("EVALSHA", ClusterHash::Offset(2), false);
                match pool
                    .with_options(&inner.options)
                    .custom::<Value, Value>(evalsha, args.clone())
                    .await
                {
                    Err(e) if is_noscript(&e) => {
                        // Same arguments, the script's text instead of its SHA.
                        let mut opts = inner.options.clone();
                        opts.timeout = Some(
                            inner
                                .deadline
                                .saturating_sub(started.elapsed())
                                .max(Duration::from_millis(1)),
                        );
                        args[0] = inner.script.clone();
                        let eval = CustomCommand::new_static("EVAL", ClusterHash::Offset(2), false);
                        pool.with_options(&opts)
                            .custom::<Value, Value>(eval, args)
                            .await
                    }
                    other => other,
                }
            };
            // fred enforces the deadline per command; this guard bounds the
            // whole check, NOSCRIPT recovery included.
            let reply = match tokio::time::timeout(inner.deadline, run).await {
                Ok(r) => r.map_err(map_err)?,
                Err(_) => return Err(StoreError::Timeout),
            };
            parse(reply, &capacities)
        })
    }
}

fn is_noscript(e: &FredError) -> bool {
    e.details().starts_with("NOSCRIPT")
}

/// How a fred error looks to the layer.
pub(crate) fn map_err(e: FredError) -> StoreError {
    match e.kind() {
        ErrorKind::Timeout => StoreError::Timeout,
        ErrorKind::IO | ErrorKind::Canceled | ErrorKind::Backpressure | ErrorKind::Routing => {
            StoreError::Unavailable(e.to_string())
        }
        ErrorKind::Protocol | ErrorKind::Parse => StoreError::Protocol(e.to_string()),
        _ => StoreError::Redis(e.to_string()),
    }
}

fn parse(reply: Value, capacities: &[f64]) -> Result<Outcome, StoreError> {
    let bad = |why: &str| StoreError::Protocol(format!("token bucket script: {why}"));
    let Value::Array(items) = reply else {
        return Err(bad("not an array"));
    };
    if items.len() != 1 + 3 * capacities.len() {
        return Err(bad("wrong length"));
    }
    let num = |v: &Value| -> Result<f64, StoreError> {
        v.as_str()
            .and_then(|s| s.parse::<f64>().ok())
            .ok_or_else(|| bad("not a number"))
    };
    let allowed = num(&items[0])? == 1.0;
    let limits = capacities
        .iter()
        .enumerate()
        .map(|(i, &capacity)| {
            Ok(LimitState {
                remaining: num(&items[1 + 3 * i])?,
                wait: num(&items[2 + 3 * i])?,
                reset: num(&items[3 + 3 * i])?,
                capacity,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(Outcome { allowed, limits })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_string_replies() {
        let reply = Value::Array(vec!["0".into(), "0.4".into(), "0.06".into(), "0.46".into()]);
        let o = parse(reply, &[5.0]).unwrap();
        assert!(!o.allowed);
        assert_eq!(o.limits[0].remaining, 0.4);
        assert_eq!(o.limits[0].wait, 0.06);
        assert!(parse(Value::Array(vec!["1".into()]), &[5.0]).is_err());
        assert!(parse(Value::Null, &[5.0]).is_err());
    }

    #[test]
    fn noscript_and_error_kinds_map() {
        let e = FredError::new(
            ErrorKind::Unknown,
            "NOSCRIPT No matching script. Please use EVAL.",
        );
        assert!(is_noscript(&e));
        assert_eq!(
            map_err(FredError::new(ErrorKind::Timeout, "t")),
            StoreError::Timeout
        );
        assert!(matches!(
            map_err(FredError::new(ErrorKind::IO, "refused")),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(map_err(e), StoreError::Redis(_)));
    }
}
