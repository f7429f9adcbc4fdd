//! The route table: which limits a request counts against, and the limits
//! and policies it holds. Built by the configuration from checked
//! parts; nothing here knows the configuration's shape.
//!
//! Routes are found by axum's [`MatchedPath`](axum::extract::MatchedPath) —
//! the route template such as `/users/{id}`, never the raw path, so
//! `/users/1` and `/users/2` share one policy and a client cannot dodge a
//! route's policy by varying the path. Requests with no matched path
//! (unmatched routes, plain hyper) get the default policy.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::Method;

#[cfg(test)]
use crate::shed::Priority;
use serde::Deserialize;

mod global;
mod limit;
mod policy;

pub(crate) use self::global::{Global, WHOLE};
pub(crate) use self::limit::{LeaseConfig, Limit};
pub(crate) use self::policy::{Policy, Traits};

/// What a route does when Redis cannot answer within the deadline
/// (`on_redis_error` in TOML).
///
/// ```
/// use fleetlimit::configuration::{FailurePolicy, RouteConfig};
///
/// let checkout = RouteConfig::new(["per-account"]).on_redis_error(FailurePolicy::Closed);
/// let search = RouteConfig::new(["per-ip"]).on_redis_error(FailurePolicy::Local);
/// # let _ = (checkout, search);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailurePolicy {
    /// Serve the request unlimited (and log it: one line a second per
    /// route, counting the others).
    Open,
    /// Answer `503 Service Unavailable` with `Retry-After`.
    Closed,
    /// Decide from in-process buckets sized limit ÷ fleet size.
    Local,
}

/// What a limit does when a request does not carry its key (`on_missing`
/// in TOML; [`LimitConfig::missing_by_ip`](crate::configuration::LimitConfig::missing_by_ip)
/// in code).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OnMissing {
    /// Refuse the request with `401 Unauthorized` (the default).
    #[default]
    Reject,
    /// Count the request by its client IP instead, in a bucket apart from
    /// every header value.
    Ip,
}

/// As the TOML file writes it: `reject`, `ip`.
impl std::fmt::Display for OnMissing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Reject => "reject",
            Self::Ip => "ip",
        })
    }
}

/// As the TOML file writes it: `open`, `closed`, `local`.
impl std::fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Open => "open",
            Self::Closed => "closed",
            Self::Local => "local",
        })
    }
}

/// What exceeding a limit does (`on_exceed` in TOML): refuse, as every
/// limit does by default, or escalate while still serving the request.
///
/// A limit that escalates is decided with the request's other limits in
/// the same atomic call, counted while it has room; once it has none, the
/// request goes on (unless another limit refuses it) and is held for the
/// delay, or reaches the handler with a [`Challenge`](crate::Challenge).
///
/// ```
/// use std::time::Duration;
/// use fleetlimit::configuration::{KeySource, LimitConfig, OnExceed, Rate};
///
/// // Sign-in failures per account: 10, one more a minute; past them, ask
/// // for a CAPTCHA instead of locking the owner out.
/// let per_account = LimitConfig::token_bucket(KeySource::Account(None), 10, Rate::per_minute(1))
///     .count_failures([401, 403])
///     .on_exceed(OnExceed::Challenge);
/// // Per IP: past 30 a minute, each request waits 2 s first.
/// let per_ip = LimitConfig::token_bucket(KeySource::ClientIp, 30, Rate::per_minute(30))
///     .on_exceed(OnExceed::Delay(Duration::from_secs(2)));
/// # let _ = (per_account, per_ip);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnExceed {
    /// `429 Too Many Requests` (the default).
    #[default]
    Refuse,
    /// Hold the request this long before the handler (at most
    /// `[escalation] max_delayed` held at once per instance; beyond that,
    /// challenged as with `Challenge`, never refused).
    Delay(std::time::Duration),
    /// Serve it, with a [`Challenge`](crate::Challenge) in its extensions
    /// for the handler to act on.
    Challenge,
}

/// How much of a limit's decision record Redis keeps (`record = true` or
/// `[limits.<name>.record]` in TOML;
/// [`LimitConfig::record`](crate::configuration::LimitConfig::record) and
/// the `record_*` setters beside it in code).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[must_use]
pub(crate) struct RecordConfig {
    pub(crate) max_len: u64,
    #[serde(deserialize_with = "crate::config::de::duration")]
    pub(crate) max_age: Duration,
}

impl Default for RecordConfig {
    /// 10 000 decisions, one hour.
    fn default() -> Self {
        Self {
            max_len: 10_000,
            max_age: Duration::from_secs(3600),
        }
    }
}

/// One `[[routes]]` entry: a route template, its methods (all when
/// `None`) and its policy.
#[derive(Clone, Debug)]
pub(crate) struct RouteEntry {
    pub(crate) path: String,
    pub(crate) methods: Option<Vec<Method>>,
    pub(crate) policy: Arc<Policy>,
}

/// The entries of one path: an optional method list and what its policy
/// compiles to.
type PathEntries<P> = Vec<(Option<Vec<Method>>, P)>;

/// `MatchedPath` (and method) → what a route's policy compiles to (the
/// request path's route plan).
#[derive(Debug)]
pub(crate) struct RouteTable<P> {
    by_path: HashMap<String, PathEntries<P>>,
    default: Option<P>,
}

impl<P> RouteTable<P> {
    /// The table of `routes`, with `default` for requests none matches,
    /// each policy compiled by `compile` once.
    pub(crate) fn new(
        routes: &[RouteEntry],
        default: Option<&Arc<Policy>>,
        compile: impl Fn(&Arc<Policy>) -> P,
    ) -> Self {
        let mut by_path: HashMap<String, PathEntries<P>> = HashMap::new();
        for r in routes {
            by_path
                .entry(r.path.clone())
                .or_default()
                .push((r.methods.clone(), compile(&r.policy)));
        }
        // A method-specific entry wins over a catch-all for the same path.
        for entries in by_path.values_mut() {
            entries.sort_by_key(|(m, _)| m.is_none());
        }
        Self {
            by_path,
            default: default.map(compile),
        }
    }
}

#[cfg(test)]
impl RouteTable<Arc<Policy>> {
    /// The policy for a request, or `None` when it is not limited.
    pub(crate) fn lookup(
        &self,
        matched_path: Option<&str>,
        method: &Method,
    ) -> Option<&Arc<Policy>> {
        self.policy_of(matched_path, method)
            .filter(|p| !p.limits.is_empty())
    }

    /// The priority of a request's route for load shedding: its policy's
    /// even when it has no limits (`limits = []` with a priority), else
    /// `normal`.
    pub(crate) fn priority(&self, matched_path: Option<&str>, method: &Method) -> Priority {
        self.policy_of(matched_path, method)
            .map_or(Priority::Normal, |p| p.priority)
    }
}

impl<P> RouteTable<P> {
    /// The policy of a request's route entry, else the default one, with or
    /// without limits.
    pub(crate) fn policy_of(&self, matched_path: Option<&str>, method: &Method) -> Option<&P> {
        let hit = matched_path
            .and_then(|p| self.by_path.get(p))
            .and_then(|entries| {
                if *method == Method::HEAD {
                    return head_entry(entries);
                }
                entries
                    .iter()
                    .find(|(ms, _)| ms.as_ref().is_none_or(|ms| ms.contains(method)))
                    .map(|(_, p)| p)
            });
        hit.or(self.default.as_ref())
    }

    /// The configured route template `path` would match, if any: a request
    /// for it that carries no `MatchedPath` means the layer is not inside
    /// the `Router`, so the route's entry is being skipped. Template
    /// segments (`{id}`, `{*rest}`) match any segment, like axum's.
    pub(crate) fn template_for(&self, path: &str) -> Option<&str> {
        self.by_path
            .keys()
            .find(|t| template_matches(t, path))
            .map(String::as_str)
    }
}

/// HEAD: axum's `get()` answers it by running the GET handler, so an entry
/// listing GET governs it too, unless an entry lists HEAD itself; an entry
/// for every method comes last, as for any method.
fn head_entry<P>(entries: &PathEntries<P>) -> Option<&P> {
    let listing = |m: &Method| {
        entries
            .iter()
            .find(|(ms, _)| ms.as_ref().is_some_and(|ms| ms.contains(m)))
    };
    listing(&Method::HEAD)
        .or_else(|| listing(&Method::GET))
        .or_else(|| entries.iter().find(|(ms, _)| ms.is_none()))
        .map(|(_, p)| p)
}

/// Whether `path` has the shape of axum route `template` (segment by
/// segment; a segment with a `{` is a parameter, `{*...}` takes the rest).
fn template_matches(template: &str, path: &str) -> bool {
    let mut t = template.split('/');
    let mut p = path.split('/');
    loop {
        match (t.next(), p.next()) {
            (None, None) => return true,
            (Some(ts), Some(ps)) if ts.starts_with("{*") => return !ps.is_empty(),
            (Some(ts), Some(ps)) if ts.contains('{') => {
                if ps.is_empty() {
                    return false;
                }
            }
            (Some(ts), Some(ps)) if ts == ps => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Rule;
    use crate::key::KeySource;

    /// A policy over limits named `names` (their numbers do not matter here).
    fn policy(names: &[&str]) -> Arc<Policy> {
        let rule = Rule::TokenBucket {
            capacity: 1.0,
            refill_per_sec: 1.0,
        };
        let limit = |n: &&str| {
            Arc::new(Limit::new(
                "rl",
                n,
                KeySource::ClientIp,
                OnMissing::Reject,
                rule,
                false,
            ))
        };
        let limits: Vec<Arc<Limit>> = names.iter().map(limit).collect();
        Arc::new(Policy {
            traits: Traits::of(&limits),
            limits,
            cost: 1,
            on_redis_error: FailurePolicy::Open,
            shadow: false,
            refund: false,
            degraded_log: Default::default(),
            priority: Priority::Normal,
            ietf_policy: Default::default(),
            metrics: crate::metrics::PolicyMetrics::new("/"),
        })
    }

    fn entry(path: &str, methods: Option<&[Method]>, names: &[&str]) -> RouteEntry {
        RouteEntry {
            path: path.into(),
            methods: methods.map(<[Method]>::to_vec),
            policy: policy(names),
        }
    }

    #[test]
    fn method_specific_entries_win_and_default_catches_the_rest() {
        let routes = [
            entry("/x", None, &["a"]),
            entry("/x", Some(&[Method::POST]), &["b"]),
        ];
        let t = RouteTable::new(&routes, Some(&policy(&["a", "b"])), Arc::clone);
        let name = |p: Option<&Arc<Policy>>| {
            p.map(|p| {
                p.limits
                    .iter()
                    .map(|l| l.name.to_string())
                    .collect::<Vec<_>>()
                    .join("+")
            })
        };
        assert_eq!(
            name(t.lookup(Some("/x"), &Method::GET)).as_deref(),
            Some("a")
        );
        assert_eq!(
            name(t.lookup(Some("/x"), &Method::POST)).as_deref(),
            Some("b")
        );
        assert_eq!(
            name(t.lookup(Some("/y"), &Method::GET)).as_deref(),
            Some("a+b")
        );
        assert_eq!(name(t.lookup(None, &Method::GET)).as_deref(), Some("a+b"));
    }

    #[test]
    fn head_follows_get_unless_listed_itself() {
        let routes = [
            entry("/x", None, &["a"]),
            entry("/x", Some(&[Method::GET]), &["b"]),
            entry("/y", Some(&[Method::GET]), &["a"]),
            entry("/y", Some(&[Method::HEAD]), &["c"]),
            entry("/z", Some(&[Method::POST]), &["a"]),
        ];
        let t = RouteTable::new(&routes, None, Arc::clone);
        let head = |p| t.lookup(Some(p), &Method::HEAD).map(|p| &*p.limits[0].name);
        assert_eq!(head("/x"), Some("b"), "GET's entry before the catch-all");
        assert_eq!(head("/y"), Some("c"), "an explicit HEAD entry wins");
        assert_eq!(head("/z"), None, "POST does not govern HEAD");
    }

    #[test]
    fn a_route_without_limits_still_has_its_priority() {
        let with = |names: &[&str], priority| {
            let mut p = Arc::into_inner(policy(names)).unwrap();
            p.priority = priority;
            Arc::new(p)
        };
        let routes = [
            RouteEntry {
                path: "/export".into(),
                methods: None,
                policy: with(&[], Priority::Sheddable),
            },
            RouteEntry {
                path: "/pay".into(),
                methods: Some(vec![Method::POST]),
                policy: with(&["a"], Priority::Critical),
            },
        ];
        let t = RouteTable::new(&routes, Some(&with(&[], Priority::Normal)), Arc::clone);
        assert!(
            t.lookup(Some("/export"), &Method::GET).is_none(),
            "not limited"
        );
        assert_eq!(
            t.priority(Some("/export"), &Method::GET),
            Priority::Sheddable
        );
        assert_eq!(t.priority(Some("/pay"), &Method::POST), Priority::Critical);
        assert_eq!(t.priority(Some("/pay"), &Method::GET), Priority::Normal);
        assert_eq!(t.priority(None, &Method::GET), Priority::Normal);
        let bare = RouteTable::new(&routes, None, Arc::clone);
        assert_eq!(
            bare.priority(Some("/other"), &Method::GET),
            Priority::Normal
        );
    }

    #[test]
    fn templates_match_paths_segment_by_segment() {
        assert!(template_matches("/", "/"));
        assert!(template_matches("/users/{id}", "/users/7"));
        assert!(!template_matches("/users/{id}", "/users/"));
        assert!(!template_matches("/users/{id}", "/users/7/x"));
        assert!(template_matches("/files/{*rest}", "/files/a/b"));
        assert!(!template_matches("/search", "/searches"));
        assert!(!template_matches("/", "/favicon.ico"));
    }
}
