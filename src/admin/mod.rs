//! Admin tasks on the configuration's Redis: inspect and reset a caller's
//! buckets ([`Admin`]). The `fleetlimit` command (feature `cli`,
//! `src/cli/`) also explains a caller's refusals from the decision
//! records, sweeps for keys left without an expiry, sets the fleet-wide
//! shedding signal and watches the fleet: those are its own, not API.
//!
//! Every key the limiter writes carries an expiry (the scripts set it in the
//! same call). A key under the prefix with no expiry (`PTTL` -1) can only
//! come from older code or a hand-made `SET`; the sweep finds such keys on
//! every primary (one `SCAN` per node on a cluster) and gives each the TTL
//! its limit would have given it, with `PEXPIRE … NX` so a key that got an
//! expiry meanwhile is left alone.
//!
//! Other applications may share the prefix: the sweep touches only keys
//! that are fleetlimit's by name (`<prefix>:<limit>:{<kind>:<value>}` or
//! `{<kind>#<digest>}` for a configured limit, the fleet heartbeat, or a
//! recording limit's `<prefix>:record:{<limit>}`) *and* by the Redis type
//! fleetlimit writes there (a string for every algorithm, a sorted set for
//! the heartbeat, a stream for decision records). Everything else is
//! reported as skipped and never written to.
//!
//! | file | what |
//! |------|------|
//! | `mod.rs` | [`Admin`], the handle: connect, and the keys a caller's value maps to |
//! | `inspect.rs` | `inspect` and `reset` (with its announcement to the instances) |
//! | `explain/` | `explain`: a caller's contract, its bucket now, its recorded decisions (`explain/words.rs`: the report in words) |
//! | `sweep.rs` | `sweep`: keys without an expiry, told apart from other applications' keys |
//! | `shed.rs` | `shed`: the fleet-wide load-shedding signal |
//! | `top/` | `top`: live instances, the keys closest to exhaustion, refusals per second (`top/frame.rs`: a frame as text) |
//! | `time.rs` | timestamps as `explain` and `top` read and write them (RFC 3339, UTC, ms) |

use std::time::Duration;

use crate::config::Config;
use crate::config::redis_url::scrub;
use crate::route::Limit;
use crate::store::{RedisStore, StoreError};

// The command's own tasks (feature `cli`). Compiled with `redis` all the
// same: the helpers they share with the limiter (reading keys back, each
// algorithm's longest TTL) then need no feature gate of their own.
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
mod explain;
mod inspect;
mod quota;
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
mod shed;
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
mod sweep;
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
mod time;
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
mod top;

#[cfg(feature = "cli")]
pub(crate) use explain::TimeRange;
pub use inspect::BucketInfo;
#[cfg(feature = "cli")]
pub(crate) use quota::global_words;
#[cfg(feature = "cli")]
pub(crate) use sweep::SweepOptions;
#[cfg(feature = "cli")]
pub(crate) use top::{Top, TopOptions};

/// Most bytes of one key name or record field the admin tools print; a
/// longer one is cut there and its length given.
pub(crate) const SHOWN_BYTES: usize = 200;

/// `text` as the admin tools print a key name, a member or a record's
/// field, which anyone who can write under the prefix chooses: control
/// characters as `\xNN` (C0 and DEL) or `\u{NNNN}` (C1 controls, and the
/// marks that reorder a line: bidi overrides and isolates), a backslash
/// doubled, so that no name can move the cursor, clear the screen or pass
/// for a line of the report; past [`SHOWN_BYTES`] bytes of output, cut and
/// followed by `…(N bytes)`, N the whole text's length.
#[must_use]
pub(crate) fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(SHOWN_BYTES + 24));
    for c in text.chars() {
        let escaped = match c {
            '\\' => "\\\\".to_owned(),
            c if c.is_ascii_control() => format!("\\x{:02x}", c as u32),
            '\u{80}'..='\u{9f}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}' => format!("\\u{{{:04x}}}", c as u32),
            c => c.to_string(),
        };
        if out.len() + escaped.len() > SHOWN_BYTES {
            out.push_str(&format!("…({} bytes)", text.len()));
            return out;
        }
        out.push_str(&escaped);
    }
    out
}

/// Serializers of the admin types' strings through [`printable`]: their
/// JSON (`fleetlimit … --json`) carries the same escaped, bounded text as
/// their words.
pub(crate) mod shown {
    use serde::Serializer;

    pub(crate) fn one<S: Serializer>(s: &str, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(&super::printable(s))
    }

    pub(crate) fn opt<S: Serializer>(s: &Option<String>, ser: S) -> Result<S::Ok, S::Error> {
        match s {
            Some(s) => ser.serialize_some(&super::printable(s)),
            None => ser.serialize_none(),
        }
    }

    pub(crate) fn all<S: Serializer>(v: &[String], ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_seq(v.iter().map(|s| super::printable(s)))
    }

    /// A duration as whole milliseconds.
    pub(crate) fn millis<S: Serializer>(
        d: &std::time::Duration,
        ser: S,
    ) -> Result<S::Ok, S::Error> {
        ser.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A connection to the configuration's Redis for the admin tasks:
/// [`inspect`](Self::inspect) and [`reset`](Self::reset) (the `fleetlimit`
/// command's other tasks are its own).
///
/// ```no_run
/// # async fn run(config: fleetlimit::Config) -> Result<(), fleetlimit::StoreError> {
/// use fleetlimit::admin::Admin;
///
/// let admin = Admin::connect(&config).await?;
/// let deleted = admin.reset("acct_42", None).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Admin {
    store: RedisStore,
    config: Config,
}

impl Admin {
    /// Connects to the configuration's Redis (standalone, Sentinel or
    /// Cluster).
    pub async fn connect(config: &Config) -> Result<Self, StoreError> {
        let r = config.redis.as_ref().ok_or_else(|| {
            StoreError::Unavailable(
                "the configuration has no [redis] section and no --redis URL".into(),
            )
        })?;
        // A refused password is reported as such, not as a timeout; no
        // text of fred's is shown with a secret of the URL in it.
        let scrub = |e: StoreError| match e {
            StoreError::Unavailable(m) => StoreError::Unavailable(scrub(&m, &r.url)),
            StoreError::Redis(m) => StoreError::Redis(scrub(&m, &r.url)),
            StoreError::Protocol(m) => StoreError::Protocol(scrub(&m, &r.url)),
            StoreError::Script(m) => StoreError::Script(scrub(&m, &r.url)),
            other => other,
        };
        let (store, started) = RedisStore::open(r, 1, Duration::from_secs(2))
            .await
            .map_err(scrub)?;
        started.map_err(|s| scrub(StoreError::from(s)))?;
        Ok(Self {
            store,
            config: config.clone(),
        })
    }

    /// Checks what an admin command is asked about before Redis is: a key value
    /// that is not empty (a request with an empty key is never counted) and, if
    /// a limit is named, one the configuration defines. The error says what is
    /// wrong, for the person typing the command.
    pub(crate) fn check_target(
        config: &Config,
        value: &str,
        limit: Option<&str>,
    ) -> Result<(), String> {
        if value.is_empty() {
            return Err(
                "the key value is empty; give the caller's API key, account, IP \
                 or ip|account (a request with an empty key is never counted)"
                    .into(),
            );
        }
        if let Some(name) = limit {
            if !config.limits.iter().any(|l| *l.name == *name) {
                let known: Vec<&str> = config.limits.iter().map(|l| &*l.name).collect();
                return Err(format!(
                    "unknown limit {name:?}; the configuration defines: {}",
                    known.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// The Redis key limit `limit` uses for the caller whose key value is
    /// `value` (an API key, an account, an IP, `ip|account`, a custom
    /// key), as requests build it: API keys and custom keys as their keyed
    /// digest. `None` when the
    /// configuration has no such limit.
    #[must_use]
    pub fn redis_key(config: &Config, limit: &str, value: &str) -> Option<String> {
        keys_of(config, value, Some(limit)).next().map(|(_, k)| k)
    }
}

/// Each limit (or the one named) with the key it uses for the caller whose
/// key value is `value`, built as the request path builds it.
fn keys_of<'a>(
    config: &'a Config,
    value: &'a str,
    limit: Option<&'a str>,
) -> impl Iterator<Item = (&'a Limit, String)> + 'a {
    config
        .limits
        .iter()
        .filter(move |l| limit.is_none_or(|n| *l.name == *n))
        .map(move |l| {
            let material = l.key.material_for(value, &config.client_ip);
            let secret = Some(&config.key_secret);
            let key = material.store_key(&l.key_head, secret, false);
            (&**l, key.key)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_targets_are_checked_before_redis() {
        let config = Config::from_toml_str(
            r#"
[limits.b]
key = "ip"
capacity = 1
refill = "1/s"

[limits.a]
key = "ip"
capacity = 1
refill = "1/s"
"#,
        )
        .unwrap();
        assert!(Admin::check_target(&config, "1.2.3.4", Some("a")).is_ok());
        assert!(Admin::check_target(&config, "1.2.3.4", None).is_ok());
        let e = Admin::check_target(&config, "1.2.3.4", Some("nope")).unwrap_err();
        assert_eq!(e, "unknown limit \"nope\"; the configuration defines: a, b");
        assert!(Admin::check_target(&config, "", None).is_err());
    }

    #[test]
    fn printable_names_cannot_forge_lines_or_drive_the_terminal() {
        assert_eq!(
            printable("rl:acct:{a:x}\nrepaired: 999"),
            "rl:acct:{a:x}\\x0arepaired: 999"
        );
        assert_eq!(printable("\x1b[2J"), "\\x1b[2J");
        let long = "k".repeat(100_000);
        assert_eq!(
            printable(&long),
            format!("{}…(100000 bytes)", "k".repeat(200))
        );
        assert_eq!(printable("plain:{a:bob}"), "plain:{a:bob}");
        assert_eq!(printable("a\\x0ab"), "a\\\\x0ab", "an escape is not forged");
        assert_eq!(printable("\r\t\u{7f}"), "\\x0d\\x09\\x7f");
        assert_eq!(printable("\u{9b}2J\u{202e}"), "\\u{009b}2J\\u{202e}");
        assert_eq!(printable("é"), "é");
        // Cut on a character's boundary, never inside an escape.
        let s = format!("{}\n", "é".repeat(150));
        let p = printable(&s);
        assert!(
            p.starts_with(&"é".repeat(100)) && p.ends_with("…(301 bytes)"),
            "{p}"
        );
        assert!(!p.contains('\n'));
    }
}
