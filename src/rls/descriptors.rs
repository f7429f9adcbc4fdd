//! Protocol → plan: a `RateLimitRequest` checked against the bounds, each
//! descriptor matched to its `[[descriptors]]` rule and made into the
//! request the rule's limits read (an `as` entry's value as the header,
//! client address or account the layer would find), with its cost.

use std::net::{IpAddr, SocketAddr};

use axum::extract::ConnectInfo;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use http::{HeaderValue, Request};
use tonic::Status;

use crate::Account;
use crate::config::{DescriptorRule, EntryIs};

/// Most descriptors one request may carry (Envoy sends one per rate limit
/// action of the route: a handful).
pub(super) const MAX_DESCRIPTORS: usize = 64;
/// Most entries one descriptor may carry.
pub(super) const MAX_ENTRIES: usize = 32;
/// The longest entry key or value, in bytes. A longer value is no key a
/// limit can use: refused rather than hashed, so nobody pays for it.
pub(super) const MAX_VALUE: usize = 4096;

/// A descriptor made ready for the limiter: rule `rule` (its index among
/// the limiter's), the request its limits read, and its cost (`None`: the
/// rule's own).
pub(super) struct Asked<'r> {
    pub(super) rule: usize,
    /// That rule.
    pub(super) of: &'r DescriptorRule,
    pub(super) req: Request<()>,
    pub(super) cost: Option<u32>,
}

/// The request checked against the bounds: `INVALID_ARGUMENT` names the
/// first thing wrong (what envoyproxy/ratelimit refuses too: an empty
/// domain, no descriptor).
pub(super) fn check(r: &RateLimitRequest) -> Result<(), Status> {
    let bad = |m: String| Err(Status::invalid_argument(m));
    if r.domain.is_empty() {
        return bad("rate limit domain must not be empty".into());
    }
    if r.domain.len() > MAX_VALUE {
        return bad(format!("domain longer than {MAX_VALUE} bytes"));
    }
    if r.descriptors.is_empty() {
        return bad("rate limit descriptor list must not be empty".into());
    }
    if r.descriptors.len() > MAX_DESCRIPTORS {
        return bad(format!("more than {MAX_DESCRIPTORS} descriptors"));
    }
    for (i, d) in r.descriptors.iter().enumerate() {
        if d.entries.is_empty() {
            return bad(format!("descriptor {i} has no entry"));
        }
        if d.entries.len() > MAX_ENTRIES {
            return bad(format!(
                "descriptor {i} has more than {MAX_ENTRIES} entries"
            ));
        }
        for e in &d.entries {
            if e.key.is_empty() {
                return bad(format!("descriptor {i} has an entry without a key"));
            }
            if e.key.len() > MAX_VALUE || e.value.len() > MAX_VALUE {
                return bad(format!(
                    "descriptor {i}: entry {:.64} has a key or value longer than {MAX_VALUE} bytes",
                    e.key
                ));
            }
        }
    }
    Ok(())
}

/// Descriptor `d` of a checked request to `domain`, among `rules` (the
/// limiter's, in order): the most specific rule it matches (the most
/// entries given by value; the first written of equals), made into what
/// the limiter decides; `None` when it matches no rule (answered `OK`, as
/// Envoy's own service does). `hits`: the request's `hits_addend` (0:
/// unset).
pub(super) fn ask<'r>(
    rules: impl Iterator<Item = &'r DescriptorRule>,
    domain: &str,
    d: &RateLimitDescriptor,
    hits: u32,
) -> Result<Option<Asked<'r>>, Status> {
    let mut best: Option<(usize, usize, &DescriptorRule)> = None;
    for (i, rule) in rules.enumerate() {
        if let Some(fixed) = matches(rule, domain, &d.entries) {
            if best.is_none_or(|(_, f, _)| fixed > f) {
                best = Some((i, fixed, rule));
            }
        }
    }
    let Some((i, _, rule)) = best else {
        return Ok(None);
    };
    let cost = match &d.hits_addend {
        Some(h) => Some(u32::try_from(h.value).map_err(|_| {
            Status::invalid_argument(format!("hits_addend {} is above 4294967295", h.value))
        })?),
        None => (hits > 0).then_some(hits),
    };
    Ok(Some(Asked {
        rule: i,
        of: rule,
        req: request(rule, &d.entries)?,
        cost,
    }))
}

/// How many of `rule`'s entries are fixed values, when `entries` match it:
/// the same keys in the same order, and those values.
fn matches(rule: &DescriptorRule, domain: &str, entries: &[Entry]) -> Option<usize> {
    if *rule.domain != *domain || rule.entries.len() != entries.len() {
        return None;
    }
    let mut fixed = 0;
    for (want, e) in rule.entries.iter().zip(entries) {
        if *want.key != *e.key {
            return None;
        }
        if let EntryIs::Value(v) = &want.is {
            if **v != *e.value {
                return None;
            }
            fixed += 1;
        }
    }
    Some(fixed)
}

/// The request `rule`'s limits read: each `as` entry's value where the
/// layer would find it, so that both charge the same key.
fn request(rule: &DescriptorRule, entries: &[Entry]) -> Result<Request<()>, Status> {
    let mut req = Request::new(());
    for (want, e) in rule.entries.iter().zip(entries) {
        let bad = |what: &str| {
            Status::invalid_argument(format!("descriptor entry {:.64}: {what}", e.key))
        };
        if !matches!(want.is, EntryIs::Value(_)) && e.value.is_empty() {
            return Err(bad("empty value"));
        }
        match &want.is {
            EntryIs::Value(_) => {}
            EntryIs::Ip => {
                let ip: IpAddr = (e.value.parse()).map_err(|_| bad("not an IP address"))?;
                let peer = SocketAddr::new(ip, 0);
                req.extensions_mut().insert(ConnectInfo(peer));
            }
            EntryIs::Header(h) => {
                let v = HeaderValue::from_bytes(e.value.as_bytes())
                    .map_err(|_| bad("a control character in the value"))?;
                req.headers_mut().insert(h.clone(), v);
            }
            EntryIs::Account => {
                req.extensions_mut().insert(Account::new(e.value.as_str()));
            }
        }
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        let entries = entries.iter().map(|(k, v)| Entry {
            key: (*k).into(),
            value: (*v).into(),
        });
        RateLimitDescriptor {
            entries: entries.collect(),
            ..RateLimitDescriptor::default()
        }
    }

    /// envoyproxy/ratelimit's example 3: an IP's own rule wins over the
    /// rule of any IP; same keys in the same order, or no rule.
    #[test]
    fn the_most_specific_rule_wins_and_nothing_else_matches() {
        let cfg = Config::from_toml_str(
            r#"
            [limits.per-ip]
            key = "ip"
            capacity = 10
            refill = "10/s"
            [limits.blocked]
            key = "global"
            capacity = 1
            refill = "1/d"
            [[descriptors]]
            domain = "edge"
            entries = [{ key = "remote_address", as = "ip" }]
            limits = ["per-ip"]
            [[descriptors]]
            domain = "edge"
            entries = [{ key = "remote_address", value = "50.0.0.5" }]
            limits = ["blocked"]
            "#,
        )
        .unwrap();
        let rules = || cfg.descriptors.iter().map(|r| &**r);
        let rule_of = |domain: &str, d: &[(&str, &str)]| {
            ask(rules(), domain, &descriptor(d), 0)
                .unwrap()
                .map(|a| (a.rule, a.cost))
        };
        assert_eq!(
            rule_of("edge", &[("remote_address", "50.0.0.5")]),
            Some((1, None))
        );
        assert_eq!(
            rule_of("edge", &[("remote_address", "50.0.0.1")]),
            Some((0, None))
        );
        assert_eq!(rule_of("other", &[("remote_address", "50.0.0.1")]), None);
        let two = [("remote_address", "50.0.0.1"), ("x", "y")];
        assert_eq!(rule_of("edge", &two), None);
        let Some(a) = ask(rules(), "edge", &descriptor(&two[..1]), 7).unwrap() else {
            panic!("a rule");
        };
        assert_eq!(a.cost, Some(7));
        let ConnectInfo(peer) = a.req.extensions().get::<ConnectInfo<SocketAddr>>().unwrap();
        assert_eq!(peer.ip().to_string(), "50.0.0.1");
        let bad = ask(
            rules(),
            "edge",
            &descriptor(&[("remote_address", "nope")]),
            0,
        );
        assert_eq!(
            bad.err().map(|s| s.code()),
            Some(tonic::Code::InvalidArgument)
        );
    }
}
