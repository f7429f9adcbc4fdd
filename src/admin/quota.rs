//! A global key's quota as its region holds it, for `inspect` and
//! `explain`: this region's share as the limiter reads it (the split when
//! none is stored, nothing for a key unclaimed since a restart, 0 for a
//! value that is not a share), and per other region the quota in flight to
//! and from it and the last exchange with it (`docs/regions.md`).
//!
//! In flight to region y: what this region holds for y (`held`), plus the
//! pending total y has not counted (`pending` − y's `got` from here); from
//! y: the same read the other way. Both need y's Redis, reached as the
//! exchange reaches it (`[regions.exchange]`): `None` when it cannot be.

use std::time::Duration;

use fred::clients::Pool;
use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, Value};

use crate::config::{Config, RedisSettings};
use crate::route::{Limit, WHOLE};
use crate::store::StoreError;
use crate::store::redis::connect::{build_pool, fred_config};
use crate::store::redis::reply::map_err;

/// How long a read of another region's Redis may take.
const REACH: Duration = Duration::from_secs(1);

/// This region's share of one key, and where it comes from.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub(crate) struct Held {
    /// This instance's region (`[regions] this`).
    #[serde(serialize_with = "super::shown::one")]
    pub(crate) region: String,
    /// This region's share, in parts per million of the limit, as the
    /// limiter reads it.
    pub(crate) ppm: u32,
    /// The same, in percent.
    pub(crate) percent: f64,
    /// `split` (none stored: the configured split), `stored`,
    /// `unclaimed` (none stored since this region's Redis restarted: the
    /// limiter holds none of it until the exchange claims it), or
    /// `unreadable` (a stored value that is not a share: read as 0).
    pub(crate) source: &'static str,
    /// The stored value, as stored (`None`: none).
    #[serde(serialize_with = "super::shown::opt")]
    pub(crate) stored: Option<String>,
    /// Per other region: quota in flight, and the last exchange.
    pub(crate) flights: Vec<Flight>,
}

/// Quota of one key between this region and another.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Flight {
    /// The other region.
    #[serde(serialize_with = "super::shown::one")]
    pub(crate) region: String,
    /// Given or held for it, not yet counted there, in parts per million
    /// (`None`: its Redis could not be read).
    pub(crate) to_ppm: Option<u64>,
    /// Given or held by it for this region, not yet counted here.
    pub(crate) from_ppm: Option<u64>,
    /// When this region's exchange last reached it, ms since the epoch
    /// (Redis's clock; `None`: not within a day).
    pub(crate) last_exchange_ms: Option<u64>,
    /// How long ago, in ms.
    pub(crate) ago_ms: Option<u64>,
}

fn part(prefix: &str, limit: &str, part: &str) -> String {
    format!("{prefix}:regions:{{{limit}}}:{part}")
}

async fn call(pool: &Pool, cmd: &'static str, args: Vec<String>) -> Result<Value, StoreError> {
    let cmd = CustomCommand::new_static(cmd, ClusterHash::FirstKey, false);
    let args: Vec<Value> = args.into_iter().map(Value::from).collect();
    pool.custom::<Value, _>(cmd, args).await.map_err(map_err)
}

/// A string value (`None`: none, or not text; a key of another type is an
/// error naming it, as the limiter cannot read it either).
async fn text(
    pool: &Pool,
    cmd: &'static str,
    args: Vec<String>,
) -> Result<Option<String>, StoreError> {
    let what = args.first().cloned().unwrap_or_default();
    let kind = if cmd == "GET" { "a string" } else { "a hash" };
    match call(pool, cmd, args).await {
        Ok(v) => Ok(v.as_string()),
        Err(e) if e.to_string().contains("WRONGTYPE") => Err(StoreError::Protocol(format!(
            "{} is not {kind}: this region's quota of the key cannot be read (the limiter \
             decides its keys as on a Redis failure)",
            super::printable(&what)
        ))),
        Err(e) => Err(e),
    }
}

/// The leading whole number of `<n>` or `<n>:<µs>` (0: none).
fn amount(v: Option<&str>) -> u64 {
    v.and_then(|v| v.split(':').next()?.parse().ok())
        .unwrap_or(0)
}

/// A share as the limiter reads it from its region's hash (`stored`: the
/// key's field, `None` when there is none): the configured split
/// `default` when there is none, the stored count of parts per million
/// (at most [`WHOLE`]), and anything else as 0 (as the exchange reads
/// it); with where it came from.
pub(crate) fn read_share(stored: Option<&str>, default: u32) -> (u32, &'static str) {
    match stored {
        None => (default, "split"),
        Some(s) => match crate::region::stored_share(s) {
            Some(n) => (n, "stored"),
            None => (0, "unreadable"),
        },
    }
}

/// This region's share of `key` in global limit `l`, without the flights.
pub(crate) async fn share(
    pool: &Pool,
    config: &Config,
    l: &Limit,
    key: &str,
) -> Result<Option<Held>, StoreError> {
    let (Some(g), Some(r)) = (&l.global, &config.regions) else {
        return Ok(None);
    };
    let p = |s: &str| part(&config.key_prefix, &l.name, s);
    let stored = text(pool, "HGET", vec![p("share"), key.into()]).await?;
    let restart = text(pool, "HGET", vec![p("gen"), "restart".into()]).await?;
    let (ppm, source) = match stored.as_deref() {
        None if restart.is_some() => (0, "unclaimed"),
        stored => read_share(stored, g.split[r.this]),
    };
    Ok(Some(Held {
        region: r.names[r.this].to_string(),
        ppm,
        percent: f64::from(ppm) * 100.0 / f64::from(WHOLE),
        source,
        stored,
        flights: Vec::new(),
    }))
}

/// A pool to another region's Redis, connected within [`REACH`].
async fn reach(url: &str) -> Option<Pool> {
    let settings = RedisSettings {
        url: url.to_owned(),
        ..RedisSettings::default()
    };
    let (cfg, _) = fred_config(&settings).ok()?;
    let pool = build_pool(cfg, 1, REACH, REACH).ok()?;
    let _ = pool.connect_pool();
    tokio::time::timeout(REACH, pool.wait_for_connect())
        .await
        .ok()?
        .ok()?;
    Some(pool)
}

/// The quota of `key` in flight between this region and each other, and
/// the last exchange with each (`now_ms`: Redis's clock here).
pub(crate) async fn flights(
    pool: &Pool,
    config: &Config,
    l: &Limit,
    key: &str,
    now_ms: u64,
) -> Result<Vec<Flight>, StoreError> {
    let Some(r) = &config.regions else {
        return Ok(Vec::new());
    };
    let p = |s: &str| part(&config.key_prefix, &l.name, s);
    let x = &*r.names[r.this];
    let mut out = Vec::new();
    for (y, name) in r.names.iter().enumerate() {
        if y == r.this {
            continue;
        }
        let field = |to: &str| format!("{key}|{to}");
        let held = text(pool, "HGET", vec![p("held"), field(name)]).await?;
        let pending = text(pool, "HGET", vec![p("pending"), field(name)]).await?;
        let got = text(pool, "GET", vec![p(&format!("got:{}", field(name)))]).await?;
        let contact = text(pool, "HGET", vec![p("gen"), format!("contact:{name}")]).await?;
        let there = match reach(&r.links[y]).await {
            Some(link) => {
                let theirs = async {
                    let held = text(&link, "HGET", vec![p("held"), field(x)]).await?;
                    let pending = text(&link, "HGET", vec![p("pending"), field(x)]).await?;
                    let got = text(&link, "GET", vec![p(&format!("got:{}", field(x)))]).await?;
                    Ok::<_, StoreError>((held, pending, got))
                };
                let read = theirs.await.ok();
                let _ = link.quit().await;
                read
            }
            None => None,
        };
        let to = match (&there, &pending) {
            (_, None) => Some(amount(held.as_deref())),
            (Some((_, _, their_got)), Some(p)) => Some(
                amount(held.as_deref())
                    + amount(Some(p)).saturating_sub(amount(their_got.as_deref())),
            ),
            (None, Some(_)) => None,
        };
        let from = there.as_ref().map(|(their_held, their_pending, _)| {
            amount(their_held.as_deref())
                + amount(their_pending.as_deref()).saturating_sub(amount(got.as_deref()))
        });
        let last = contact.and_then(|c| c.parse::<u64>().ok());
        out.push(Flight {
            region: name.to_string(),
            to_ppm: to,
            from_ppm: from,
            last_exchange_ms: last,
            ago_ms: last.map(|t| now_ms.saturating_sub(t)),
        });
    }
    Ok(out)
}

/// The flights in words, one line per region (each line indented by
/// `indent`).
pub(crate) fn words(flights: &[Flight], indent: &str) -> String {
    let ppm = |v: Option<u64>| {
        v.map_or_else(
            || "unknown (its Redis not reached)".into(),
            |n| format!("{n} ppm"),
        )
    };
    let mut out = String::new();
    for f in flights {
        let last = match (f.last_exchange_ms, f.ago_ms) {
            (Some(_), Some(ago)) => format!("{} s ago", ago as f64 / 1000.0),
            _ => "none within a day".into(),
        };
        out.push_str(&format!(
            "{indent}with region {}: in flight to it {}, from it {}; last exchange {last}\n",
            super::printable(&f.region),
            ppm(f.to_ppm),
            ppm(f.from_ppm),
        ));
    }
    out
}

/// `inspect`'s lines for a global limit's bucket: the share it is read
/// under, and the flights (nothing for a regional limit).
#[cfg(feature = "cli")]
pub(crate) fn global_words(b: &super::BucketInfo) -> String {
    let Some(g) = &b.global else {
        return String::new();
    };
    let source = match g.source {
        "split" => "none stored: the configured split",
        "unclaimed" => "none since this region's Redis restarted: none held until claimed",
        "unreadable" => "its stored value is not a share: read as 0",
        _ => "stored",
    };
    format!(
        "    global: region {} holds {}% ({} ppm) of the limit for this caller ({source}); \
         the bucket above is read under that share, as the layer decides\n{}",
        super::printable(&g.region),
        g.percent,
        g.ppm,
        words(&g.flights, "    ")
    )
}
