//! `[[descriptors]]`: what Envoy's rate limit service (`fleetlimit rls`,
//! feature `rls`, docs/rls.md) charges a request's descriptor to. An entry
//! names the descriptor it matches (a domain and its entries, in order)
//! and, like a route, the limits it counts against, its cost, failure
//! policy and mode. An entry of the descriptor with a `value` must carry
//! that value; one with `as` takes any value, which becomes the key
//! material of the limits keyed by that source (`as = "header:x-api-key"`
//! charges the bucket a request carrying that header charges through the
//! layer).

use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use serde::Deserialize;

use super::ConfigError;
use super::limit::Mode;
use super::place::Place;
use super::route::RouteConfig;
use super::validate::Validator;
use crate::key::KeySource;
use crate::route::{FailurePolicy, Limit, OnExceed, Policy};

/// A `[[descriptors]]` entry as the file writes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DescriptorConfig {
    domain: String,
    entries: Vec<EntryConfig>,
    limits: Vec<String>,
    cost: Option<u32>,
    on_redis_error: Option<FailurePolicy>,
    #[serde(default)]
    mode: Mode,
}

/// One `{ key = …, value = … }` or `{ key = …, as = … }`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryConfig {
    key: String,
    value: Option<String>,
    #[serde(rename = "as")]
    source: Option<String>,
}

/// A descriptor's rule, compiled: what it matches and the route policy
/// it is decided under.
#[derive(Debug)]
pub(crate) struct DescriptorRule {
    pub(crate) domain: Box<str>,
    pub(crate) entries: Vec<Entry>,
    pub(crate) policy: Arc<Policy>,
}

/// One entry the descriptor must have, at its place.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) key: Box<str>,
    pub(crate) is: EntryIs,
}

/// What an entry's value is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EntryIs {
    /// This value exactly.
    Value(Box<str>),
    /// Any value: the client IP (`as = "ip"`).
    Ip,
    /// Any value: this request header's (`as = "header:<name>"`).
    Header(HeaderName),
    /// Any value: the account (`as = "account"`).
    Account,
}

impl fmt::Display for EntryIs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Value(v) => write!(f, "{v:?}"),
            Self::Ip => f.write_str("as ip"),
            Self::Header(h) => write!(f, "as header:{h}"),
            Self::Account => f.write_str("as account"),
        }
    }
}

impl DescriptorRule {
    /// The rule in words, for `describe()` and metrics labels.
    pub(crate) fn describe(&self) -> String {
        describe(&self.domain, &self.entries)
    }

    /// Whether its entries provide what `source` reads from a request.
    fn provides(&self, source: &KeySource) -> bool {
        let has = |want: &EntryIs| self.entries.iter().any(|e| e.is == *want);
        let header = |h: &HeaderName| has(&EntryIs::Header(h.clone()));
        let account =
            |h: &Option<HeaderName>| has(&EntryIs::Account) || h.as_ref().is_some_and(header);
        match source {
            KeySource::Global => true,
            KeySource::ClientIp => has(&EntryIs::Ip),
            KeySource::Header(h) => header(h),
            KeySource::Account(h) => account(h),
            KeySource::IpAndAccount(h) => has(&EntryIs::Ip) && account(h),
            KeySource::Custom(_) => false,
        }
    }
}

impl Validator<'_> {
    /// `[[descriptors]]` checked and compiled, each error at its place.
    pub(super) fn descriptors(
        &self,
        limits: &[Arc<Limit>],
        list: &[DescriptorConfig],
    ) -> Result<Vec<Arc<DescriptorRule>>, ConfigError> {
        let mut rules: Vec<Arc<DescriptorRule>> = Vec::with_capacity(list.len());
        for (i, d) in list.iter().enumerate() {
            let at = Place::of(&["descriptors", &i.to_string()]);
            if d.domain.is_empty() {
                return Err(self.err(at.field("domain"), "domain must not be empty"));
            }
            if d.entries.is_empty() {
                return Err(self.err(at.field("entries"), "a descriptor needs at least one entry"));
            }
            let mut entries = Vec::with_capacity(d.entries.len());
            for (j, e) in d.entries.iter().enumerate() {
                let e_at = at.field("entries").field(&j.to_string());
                entries.push(self.entry(e, &e_at)?);
            }
            let route = RouteConfig {
                cost: d.cost,
                on_redis_error: d.on_redis_error,
                mode: d.mode,
                ..RouteConfig::new(d.limits.iter().cloned())
            };
            let label = format!("rls {}", describe(&d.domain, &entries));
            let rule = DescriptorRule {
                domain: d.domain.as_str().into(),
                entries,
                policy: self.policy(limits, &route, &at, &label)?,
            };
            for (j, l) in rule.policy.limits.iter().enumerate() {
                if let Some(why) = after_the_answer(l) {
                    let msg = format!(
                        "limit {:?} {why}, and Envoy's protocol says nothing after its answer: \
                         a descriptor cannot use it",
                        l.name
                    );
                    return Err(self.err(at.field("limits").field(&j.to_string()), msg));
                }
                if !rule.provides(&l.key) {
                    let msg = format!(
                        "limit {:?} is keyed by {}, which no entry of this descriptor provides \
                         (an entry with `as = \"ip\"`, `\"header:<name>\"` or `\"account\"`; \
                         a custom key needs the application's extractor, which the rate limit \
                         service has not)",
                        l.name,
                        l.key.describe()
                    );
                    return Err(self.err(at.field("limits").field(&j.to_string()), msg));
                }
            }
            if rules
                .iter()
                .any(|r| r.domain == rule.domain && same_entries(r, &rule))
            {
                return Err(self.err(
                    at,
                    format!("descriptor {} is listed twice", rule.describe()),
                ));
            }
            rules.push(Arc::new(rule));
        }
        Ok(rules)
    }

    fn entry(&self, e: &EntryConfig, at: &Place) -> Result<Entry, ConfigError> {
        if e.key.is_empty() {
            return Err(self.err(at.field("key"), "an entry's key must not be empty"));
        }
        let is = match (&e.value, &e.source) {
            (Some(v), None) if v.is_empty() => {
                return Err(self.err(at.field("value"), "an entry's value must not be empty"));
            }
            (Some(v), None) => EntryIs::Value(v.as_str().into()),
            (None, Some(s)) => match s.parse::<KeySource>() {
                Ok(KeySource::ClientIp) => EntryIs::Ip,
                Ok(KeySource::Header(h)) => EntryIs::Header(h),
                Ok(KeySource::Account(None)) => EntryIs::Account,
                _ => {
                    let msg = format!(
                        "entry {:?}: `as = {s:?}` must be \"ip\", \"header:<name>\" or \"account\"",
                        e.key
                    );
                    return Err(self.err(at.field("as"), msg));
                }
            },
            (Some(_), Some(_)) => {
                let msg = format!("entry {:?} has both `value` and `as`: give one", e.key);
                return Err(self.err(at.field("as"), msg));
            }
            (None, None) => {
                let msg = format!(
                    "entry {:?} needs `value` (the value it must have) or `as` (the key \
                     material its value becomes: \"ip\", \"header:<name>\" or \"account\")",
                    e.key
                );
                return Err(self.err(at.clone(), msg));
            }
        };
        Ok(Entry {
            key: e.key.as_str().into(),
            is,
        })
    }
}

/// What a limit needs of the request after its decision, which a
/// descriptor's call cannot give: the end of the request (a concurrency
/// slot), the handler's status (`count = "failures"`), the handler itself
/// (`on_exceed = "delay"` or `"challenge"`).
fn after_the_answer(l: &Limit) -> Option<&'static str> {
    if l.rule.is_concurrency() {
        Some("counts requests in flight (its slot is given back when the request ends)")
    } else if l.failures.is_some() {
        Some("counts failures (the handler's status gives a success back)")
    } else if l.on_exceed != OnExceed::Refuse {
        Some("escalates (`on_exceed`: the handler delays or challenges)")
    } else {
        None
    }
}

/// Two rules that match the same descriptors.
fn same_entries(a: &DescriptorRule, b: &DescriptorRule) -> bool {
    fn key_of(e: &Entry) -> (&str, Option<&str>) {
        match &e.is {
            EntryIs::Value(v) => (&e.key, Some(v)),
            _ => (&e.key, None),
        }
    }
    a.entries.len() == b.entries.len()
        && a.entries
            .iter()
            .map(key_of)
            .eq(b.entries.iter().map(key_of))
}

fn describe(domain: &str, entries: &[Entry]) -> String {
    let entries: Vec<String> = (entries.iter())
        .map(|e| format!("{}={}", e.key, e.is))
        .collect();
    format!("{domain} [{}]", entries.join(", "))
}
