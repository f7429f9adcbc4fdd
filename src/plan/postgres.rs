//! Plans read from a PostgreSQL table (crate feature `postgres`).
//!
//! [`PostgresPlans`] is a [`PlanResolver`]: the layer asks it through the
//! plan cache (`[plan_cache] ttl`, one lookup in flight per key), so a
//! change in the table reaches every instance within the TTL, and each
//! instance asks Postgres at most once per key and TTL.
//!
//! A lookup that fails (Postgres down, a missing table, a lookup slower
//! than [`lookup_timeout`](PostgresPlans::lookup_timeout)) gives the
//! caller the limit's base numbers and is logged, at most a line a second
//! with the count held back: a database outage never turns into a `500`
//! nor a log flood. A plan name the configuration does not define is the
//! base numbers too, and logged by the layer.

use std::fmt;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

use std::future::Future;
use std::pin::Pin;

use super::resolver::{PlanError, PlanResolver};
use crate::config::ConfigError;

/// The table read by default.
const DEFAULT_TABLE: &str = "fleetlimit_plans";
/// Connections kept per instance: lookups are one short indexed read each.
const POOL_SIZE: usize = 4;

/// A [`PlanResolver`] reading `SELECT plan FROM <table> WHERE subject = $1`
/// from PostgreSQL, where `subject` is the limit's key value (the API key,
/// the account id).
///
/// The table (its name is yours to choose, `fleetlimit_plans` by default):
///
/// ```sql
/// CREATE TABLE fleetlimit_plans (
///     subject text PRIMARY KEY,  -- the API key or account the limit counts by
///     plan    text NOT NULL      -- a plan defined under [plans] in the config
/// );
/// ```
///
/// A subject without a row gets the limit's base numbers. Connections are
/// made when first needed (plain TCP, no TLS), so building the resolver
/// never waits on the database.
///
/// ```no_run
/// use std::time::Duration;
/// use fleetlimit::plan::PostgresPlans;
/// use fleetlimit::{Config, RateLimitLayer};
///
/// # async fn f(cfg: Config) -> Result<(), Box<dyn std::error::Error>> {
/// let plans = PostgresPlans::connect("postgres://app@127.0.0.1:5432/accounts")?
///     .table("billing.api_plans")?
///     .lookup_timeout(Duration::from_millis(200));
/// let layer = RateLimitLayer::new(cfg).plan_resolver(plans).await?;
/// # let _ = layer;
/// # Ok(()) }
/// ```
pub struct PostgresPlans {
    pool: Pool,
    query: String,
    table: String,
    timeout: Duration,
}

impl fmt::Debug for PostgresPlans {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresPlans")
            .field("table", &self.table)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl PostgresPlans {
    /// A resolver on the database at `url` (`postgres://user@host:port/db`,
    /// or the `key=value` form), reading table `fleetlimit_plans`, with a
    /// 250 ms lookup timeout. Connects lazily.
    pub fn connect(url: &str) -> Result<Self, ConfigError> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| ConfigError::new(format!("invalid PostgreSQL URL: {e}")))?;
        let timeout = Duration::from_millis(250);
        // A connect that hangs (a dropped SYN) ends with the lookup.
        config.connect_timeout(timeout);
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .build()
            .map_err(|e| ConfigError::new(format!("PostgreSQL pool: {e}")))?;
        Ok(Self::from_pool(pool).with_timeout(timeout))
    }

    /// A resolver on a pool of your own (its TLS, sizes and timeouts).
    pub fn from_pool(pool: Pool) -> Self {
        let table = format!("\"{DEFAULT_TABLE}\"");
        Self {
            pool,
            query: query(&table),
            table,
            timeout: Duration::from_millis(250),
        }
    }

    fn with_timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Read this table instead: `name` or `schema.name`, each part letters,
    /// digits and `_`, not starting with a digit (it is quoted as given, so
    /// case matters).
    pub fn table(mut self, name: &str) -> Result<Self, ConfigError> {
        self.table = quote_table(name)?;
        self.query = query(&self.table);
        Ok(self)
    }

    /// The longest one lookup may take, from waiting for a connection to
    /// the row (250 ms by default). Slower: base numbers, logged. Keep it
    /// well below the Redis-free part of your latency budget: the first
    /// request of a key (per cache TTL) waits for it. The layer's own bound
    /// on any resolver (1 s) still applies above it.
    pub fn lookup_timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }
}

impl PlanResolver for PostgresPlans {
    fn resolve<'a>(
        &'a self,
        key: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Option<String>, PlanError>> + Send + 'a>> {
        Box::pin(async move {
            // An error, not "no plan": the plan cache logs it (once a
            // second) and asks again soon; the caller gets the base numbers.
            let failed = |what: &str| {
                PlanError::from(format!(
                    "plan lookup in PostgreSQL failed ({what}) on table {}",
                    self.table
                ))
            };
            match tokio::time::timeout(self.timeout, self.lookup(key)).await {
                Ok(Ok(plan)) => Ok(plan),
                Ok(Err(e)) => Err(failed(&e)),
                Err(_) => Err(failed(&format!("timed out after {:?}", self.timeout))),
            }
        })
    }
}

impl PostgresPlans {
    /// One lookup. A connection whose query is cut off by the timeout is
    /// not given back to the pool: it may still be waiting
    /// on a lock, and the next lookup must not queue behind it.
    async fn lookup(&self, subject: &str) -> Result<Option<String>, String> {
        struct Guard(Option<Object>);
        impl Drop for Guard {
            fn drop(&mut self) {
                if let Some(obj) = self.0.take() {
                    // Dropped here, the connection closes instead.
                    drop(Object::take(obj));
                }
            }
        }
        let client = self.pool.get().await.map_err(|e| e.to_string())?;
        let mut guard = Guard(Some(client));
        let result = async {
            let client = guard.0.as_ref().ok_or("no connection")?;
            let stmt = client
                .prepare_cached(&self.query)
                .await
                .map_err(|e| e.to_string())?;
            let row = client
                .query_opt(&stmt, &[&subject])
                .await
                .map_err(|e| e.to_string())?;
            row.map(|r| r.try_get::<_, String>(0).map_err(|e| e.to_string()))
                .transpose()
        }
        .await;
        // Finished (answer or error): back to the pool.
        drop(guard.0.take());
        result
    }
}

fn query(table: &str) -> String {
    format!("SELECT plan FROM {table} WHERE subject = $1")
}

/// `a.b` → `"a"."b"`, refusing anything but plain identifiers.
fn quote_table(name: &str) -> Result<String, ConfigError> {
    let parts: Vec<&str> = name.split('.').collect();
    let plain = |p: &str| {
        !p.is_empty()
            && p.len() <= 63
            && !p.starts_with(|c: char| c.is_ascii_digit())
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if parts.len() > 2 || !parts.iter().all(|p| plain(p)) {
        return Err(ConfigError::new(format!(
            "invalid table name {name:?}: expected name or schema.name, of letters, digits and _"
        )));
    }
    Ok(parts
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers_quoted() {
        assert_eq!(
            quote_table("fleetlimit_plans").unwrap(),
            "\"fleetlimit_plans\""
        );
        assert_eq!(
            quote_table("billing.Plans_2").unwrap(),
            "\"billing\".\"Plans_2\""
        );
        for bad in [
            "",
            "a.b.c",
            "1abc",
            "a;drop table x",
            "a\"b",
            "a b",
            ".a",
            "a.",
        ] {
            assert!(quote_table(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_urls_fail_at_construction() {
        let e = PostgresPlans::connect("postgres://u@h:notaport/db").unwrap_err();
        assert!(e.to_string().contains("invalid PostgreSQL URL"), "{e}");
        let e = PostgresPlans::connect("postgres://u@127.0.0.1/db")
            .unwrap()
            .table("x;y")
            .unwrap_err();
        assert!(e.to_string().contains("invalid table name"), "{e}");
    }
}
