//! The rate-limit fields of a decision ([`RateHeaders`]): which limit the
//! legacy fields report, the IETF items, and the numbers as clients read
//! them (whole requests of the route's cost, seconds rounded up).

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use std::fmt::Write as _;
use std::sync::Arc;

use sfv::{Integer, KeyRef, ListSerializer, StringRef};
use smallvec::SmallVec;

use super::headers::{
    HeaderStyle, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
    X_RATELIMIT_RESET,
};
use crate::algorithm::{LimitState, Rule};

/// One limit of the route, for the IETF fields.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Item {
    pub(crate) name: Arc<str>,
    /// `q`: a full bucket, a window's requests, or the slots.
    pub(crate) quota: f64,
    /// `w`, seconds: the time to refill a full bucket, or the window; none
    /// for a concurrency limit (slots are not a rate).
    pub(crate) window: Option<f64>,
    /// `r` and `t` (seconds until full); `None`: not known here.
    pub(crate) state: Option<(f64, f64)>,
    /// In shadow mode: never refuses, so not part of the contract.
    pub(crate) shadow: bool,
    /// Units one request of this route takes from the limit.
    pub(crate) per: f64,
    /// Units the limit admits beyond its remaining (see [`Rule::slack`]).
    slack: f64,
}

impl Item {
    /// The limit `name` under `rule` (the caller's plan's numbers), for a
    /// request of `cost`.
    pub(crate) fn new(name: &Arc<str>, rule: &Rule, shadow: bool, cost: f64) -> Self {
        let window = match *rule {
            // q = B, w = B / r: a full bucket, and the time it takes to
            // refill one. A client spending q per w is never refused.
            Rule::TokenBucket {
                capacity,
                refill_per_sec,
            } => Some(capacity / refill_per_sec),
            Rule::FixedWindow { window, .. } | Rule::SlidingWindow { window, .. } => {
                Some(window.as_secs_f64())
            }
            Rule::Concurrency { .. } => None,
        };
        Self {
            name: Arc::clone(name),
            quota: rule.capacity(),
            window,
            state: None,
            shadow,
            per: per_request(rule, cost),
            slack: rule.slack(),
        }
    }

    /// Whole requests a full limit holds.
    pub(crate) fn quota_requests(&self) -> u64 {
        requests(self.quota, self.per)
    }

    /// Whole requests left, when known.
    pub(crate) fn requests_left(&self) -> Option<u64> {
        self.state.map(|(r, _)| requests(r + self.slack, self.per))
    }

    /// With a bucket's state.
    pub(crate) fn with(mut self, s: &LimitState) -> Self {
        self.state = Some((s.remaining, s.reset));
        self
    }
}

/// The rate-limit headers of one response: every limit of the route (the
/// IETF fields list them all), and which of them the legacy headers report.
/// On an admission that is always the one that refuses first, chosen here
/// from the items' own states (see [`binds_first`]), so no caller can
/// report another.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RateHeaders {
    pub(crate) style: HeaderStyle,
    pub(crate) items: SmallVec<[Item; 1]>,
    /// The item `X-RateLimit-*` report.
    reported: usize,
    /// Decided by the `local` failure policy's buckets: this instance's
    /// share, not the fleet's count, so no remaining and no reset is
    /// claimed (see "Degraded mode" in docs/algorithms.md).
    pub(crate) local: bool,
    /// `RateLimit-Policy` written already (see [`policy_value`]), when it
    /// is the route's own (no plan changed its numbers).
    /// Shared, to keep a decision small.
    pub(crate) policy: Option<Arc<HeaderValue>>,
}

impl RateHeaders {
    /// The headers of these items: `refused_by`, the limit a refusal
    /// reports (see [`refusing`]); `None` on an admission, which reports
    /// the limit that refuses first.
    pub(crate) fn new(
        style: HeaderStyle,
        items: SmallVec<[Item; 1]>,
        refused_by: Option<usize>,
    ) -> Self {
        let mut h = Self {
            style,
            items,
            reported: refused_by.unwrap_or(0),
            local: false,
            policy: None,
        };
        // One item binds by itself.
        if refused_by.is_none() && h.items.len() > 1 {
            h.reported = h.binding();
        }
        h
    }

    /// The item that refuses first: of the limits in the contract (not in
    /// shadow mode) whose state is known, the one with the fewest whole
    /// requests left; shadow limits only on a route of nothing else.
    fn binding(&self) -> usize {
        let known = |shadow: bool| {
            let items = self.items.iter().enumerate();
            let known = items.filter(move |(_, it)| it.shadow == shadow);
            known.filter_map(|(i, it)| Some((i, it.requests_left()?, it.state?.1)))
        };
        binds_first(known(false))
            .or_else(|| binds_first(known(true)))
            .unwrap_or(0)
    }

    /// The same headers, `secs` later (a remembered refusal): each reset
    /// counted down.
    pub(crate) fn aged(mut self, secs: f64) -> Self {
        for it in &mut self.items {
            if let Some((_, reset)) = &mut it.state {
                *reset = (*reset - secs).max(0.0);
            }
        }
        self
    }

    /// Item `i`'s state is now `s` (a refund of an admitted request); the
    /// legacy headers report the limit that refuses first again.
    pub(crate) fn update(&mut self, i: usize, s: &LimitState) {
        if let Some(it) = self.items.get_mut(i) {
            it.state = Some((s.remaining, s.reset));
        }
        self.reported = self.binding();
    }

    /// The item `X-RateLimit-*` report (Envoy's descriptor status, `rls/`).
    #[cfg(feature = "rls")]
    pub(crate) fn reported(&self) -> Option<&Item> {
        self.items.get(self.reported)
    }

    /// Whole requests left in the reported limit, whoever decided (for logs).
    pub(crate) fn left(&self) -> u64 {
        self.items
            .get(self.reported)
            .and_then(Item::requests_left)
            .unwrap_or(0)
    }

    /// `X-RateLimit-Remaining` as written (whole requests, rounded down);
    /// `None` when not written.
    pub(crate) fn remaining(&self) -> Option<u64> {
        let it = self.items.get(self.reported)?;
        if self.local {
            return None;
        }
        it.requests_left()
    }

    /// What [`write`](Self::write) writes, as numbers, when the headers
    /// report one limit, `name` (a route of one limit): equal fingerprints
    /// and the same kept [`policy`](Self::policy) write equal headers, so
    /// a refusal's can be kept and cloned.
    pub(crate) fn fingerprint(&self, name: &Arc<str>) -> Option<[u64; 5]> {
        let [it] = &self.items[..] else {
            return None;
        };
        if !Arc::ptr_eq(&it.name, name) {
            return None;
        }
        let flags = self.style as u64
            | u64::from(self.local) << 2
            | u64::from(it.shadow) << 3
            | u64::from(it.state.is_some()) << 4
            | u64::from(it.window.is_some()) << 5;
        let (left, reset) = it.state.map_or((0, 0), |(_, t)| {
            (it.requests_left().unwrap_or(0), whole_secs(t))
        });
        let window = it.window.map_or(0, |w| whole_secs(w).max(1));
        Some([flags, it.quota_requests(), left, reset, window])
    }

    pub(crate) fn write(&self, h: &mut impl Fields) {
        if self.style.legacy() {
            if let Some(it) = self.items.get(self.reported) {
                h.put_number(&X_RATELIMIT_LIMIT, it.quota_requests(), limit_value);
                if let (Some(left), Some((_, reset)), false) =
                    (it.requests_left(), it.state, self.local)
                {
                    h.put_number(&X_RATELIMIT_REMAINING, left, number);
                    h.put_number(&X_RATELIMIT_RESET, whole_secs(reset), number);
                }
            }
        }
        if self.style.ietf() {
            let shown = || self.items.iter().filter(|it| !it.shadow);
            let kept = self.policy.as_deref().cloned();
            if let Some(v) = kept.or_else(|| policy_value(&self.items)) {
                h.put(&RATELIMIT_POLICY, v);
            }
            if self.local {
                return;
            }
            let mut now = ListSerializer::new();
            for it in shown() {
                if let (Some(left), Some((_, reset))) = (it.requests_left(), it.state) {
                    let _ = now
                        .bare_item(sf_name(&it.name))
                        .parameter(KeyRef::constant("r"), sf_int(left))
                        .parameter(KeyRef::constant("t"), sf_int(whole_secs(reset)));
                }
            }
            if let Some(v) = now.finish().and_then(|v| HeaderValue::try_from(v).ok()) {
                h.put(&RATELIMIT, v);
            }
        }
    }
}

/// Where [`RateHeaders::write`] writes its fields, each name once: a
/// response's headers, or (`rls/`) Envoy's list of fields to add, built
/// without a map in between.
pub(crate) trait Fields {
    fn put(&mut self, name: &HeaderName, value: HeaderValue);
    /// The number `n`; `value` makes it a header value (the shared values
    /// of [`number`] or [`limit_value`]), where a sink needs one.
    fn put_number(&mut self, name: &HeaderName, n: u64, value: fn(u64) -> HeaderValue);
}

impl Fields for HeaderMap {
    fn put(&mut self, name: &HeaderName, value: HeaderValue) {
        self.insert(name.clone(), value);
    }

    #[inline]
    fn put_number(&mut self, name: &HeaderName, n: u64, value: fn(u64) -> HeaderValue) {
        self.insert(name.clone(), value(n));
    }
}

/// `RateLimit-Policy` of these limits: each one's `q` (in requests of the
/// items' cost) and `w`, shadow limits left out (they are no part of the
/// contract).
pub(crate) fn policy_value(items: &[Item]) -> Option<HeaderValue> {
    let mut policy = ListSerializer::new();
    for it in items.iter().filter(|it| !it.shadow) {
        let p = policy
            .bare_item(sf_name(&it.name))
            .parameter(KeyRef::constant("q"), sf_int(it.quota_requests()));
        if let Some(w) = it.window {
            // Rounded up, at least 1: a client spending q per w is
            // never refused.
            let _ = p.parameter(KeyRef::constant("w"), sf_int(whole_secs(w).max(1)));
        }
    }
    policy.finish().and_then(|v| HeaderValue::try_from(v).ok())
}

/// A policy's name as an sf-string. Limit names are letters, digits, `-`,
/// `_` and `.` (checked at start-up): always a valid sf-string, not always
/// a token (`9-lives`), hence strings.
fn sf_name(name: &str) -> &StringRef {
    StringRef::from_str(name).unwrap_or(StringRef::constant("?"))
}

/// An sf-integer: at most 15 digits, saturated.
fn sf_int(n: u64) -> Integer {
    Integer::constant(
        i64::try_from(n)
            .unwrap_or(i64::MAX)
            .min(999_999_999_999_999),
    )
}

/// Units one request of `cost` takes from a limit of `rule`: a
/// concurrency limit takes one slot whatever the cost.
pub(crate) fn per_request(rule: &Rule, cost: f64) -> f64 {
    if rule.is_concurrency() { 1.0 } else { cost }
}

/// Whole requests of `per` units that `units` allow, rounded down. A cost
/// below one unit (none is configured: a computed 0 counts as 1) counts as
/// one, so a count is never inflated.
pub(crate) fn requests(units: f64, per: f64) -> u64 {
    whole_down(units / per.max(1.0))
}

/// Units in two places a request cannot take from at once (a lease here,
/// the bucket in Redis), as the whole requests of `per` they hold: a
/// request is served by one or the other, so a part of a request in each
/// is no request.
pub(crate) fn apart(here: f64, there: f64, per: f64) -> f64 {
    let per = per.max(1.0);
    let whole = |x: f64| (x / per).floor().max(0.0) * per;
    whole(here) + whole(there)
}

/// Of `(index, whole requests left, seconds until full)` candidates, the
/// limit that refuses first: the fewest requests left; on a tie, the one
/// longest from full, whose refusal will last longest (a full window of
/// 5 beside an hourly bucket with 5 left is the bucket); then the first in
/// the route's order.
pub(crate) fn binds_first(candidates: impl Iterator<Item = (usize, u64, f64)>) -> Option<usize> {
    candidates
        .min_by(|a, b| a.1.cmp(&b.1).then(b.2.total_cmp(&a.2)))
        .map(|(i, _, _)| i)
}

/// Whole units, rounded down: a hair under a whole token is not a token,
/// so the header never promises a request that would be refused.
fn whole_down(x: f64) -> u64 {
    // `as` truncates toward zero and saturates (a negative or NaN x is 0):
    // for x ≥ 0 that is the floor, without a call into libm.
    x as u64
}

/// `X-RateLimit-Reset`: rounded up, so a client waiting that long finds
/// the bucket full.
/// Saturated to `0..=u64::MAX` (NaN: 0), without libm.
pub(crate) fn whole_secs(secs: f64) -> u64 {
    let down = secs as u64;
    if (down as f64) < secs {
        down.saturating_add(1)
    } else {
        down
    }
}

/// Header values of numbers below [`NUMBERS`] (every `Retry-After` and
/// reset of an hourly limit included) are slices of one text written once
/// and never freed: a clone copies a pointer, with no reference count for
/// the server's threads to contend on. Larger ones are formatted.
pub(super) fn number(n: u64) -> HeaderValue {
    const NUMBERS: u64 = 4096;
    static VALUES: std::sync::OnceLock<Vec<HeaderValue>> = std::sync::OnceLock::new();
    if n >= NUMBERS {
        return formatted(n);
    }
    let values = VALUES.get_or_init(|| {
        let mut text = String::new();
        let mut ends = Vec::with_capacity(NUMBERS as usize);
        for i in 0..NUMBERS {
            let _ = write!(text, "{i}");
            ends.push(text.len());
        }
        // One allocation for the process's life, a few kilobytes.
        let text: &'static str = Box::leak(text.into_boxed_str());
        let mut start = 0;
        ends.into_iter()
            .map(|end| {
                let v = HeaderValue::from_static(&text[start..end]);
                start = end;
                v
            })
            .collect()
    });
    values[n as usize].clone()
}

/// A number's header value in one allocation of its digits' length
/// (`HeaderValue::from` takes two: a buffer of the type's widest number,
/// then, its length being less, the shared handle `Bytes` keeps of it).
fn formatted(n: u64) -> HeaderValue {
    let mut digits = itoa::Buffer::new();
    HeaderValue::from_bytes(digits.format(n).as_bytes()).unwrap_or_else(|_| HeaderValue::from(n))
}

/// `X-RateLimit-Limit`: a limit's capacity, one of the few the
/// configuration holds, so large ones are remembered too (per thread, a
/// handful) instead of formatted for every response.
fn limit_value(n: u64) -> HeaderValue {
    const SLOTS: usize = 8;
    thread_local! {
        static RECENT: std::cell::RefCell<[Option<(u64, HeaderValue)>; SLOTS]> =
            const { std::cell::RefCell::new([const { None }; SLOTS]) };
    }
    if n < 4096 {
        return number(n);
    }
    RECENT.with(|recent| {
        let slot = &mut recent.borrow_mut()[(n % SLOTS as u64) as usize];
        match slot {
            Some((m, v)) if *m == n => v.clone(),
            _ => slot.insert((n, formatted(n))).1.clone(),
        }
    })
}

/// The limit a refusal reports: the refusing limit that makes the client
/// wait longest (its `Retry-After`). Limits for which `soft(i)` is true
/// (shadow mode, escalation) refuse nothing. `None`: no limit refused.
pub(crate) fn refusing(ls: &[LimitState], soft: impl Fn(usize) -> bool) -> Option<usize> {
    (0..ls.len())
        .filter(|&i| !ls[i].enough && !soft(i))
        .max_by(|&a, &b| ls[a].wait.total_cmp(&ls[b].wait))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(name: &str, capacity: f64, refill_per_sec: f64) -> Item {
        costly(name, capacity, refill_per_sec, 1.0)
    }

    /// `X-RateLimit-Remaining` of `it` alone with `remaining` units left.
    fn remaining_of(mut it: Item, remaining: f64) -> Option<u64> {
        it.state = Some((remaining, 1.0));
        RateHeaders::new(HeaderStyle::Legacy, smallvec::smallvec![it], None).remaining()
    }

    /// A concurrency limit's item (30 s holds) for requests of `cost`.
    fn slots(name: &str, max_in_flight: f64, cost: f64) -> Item {
        let rule = Rule::Concurrency {
            max_in_flight,
            max_hold: std::time::Duration::from_secs(30),
        };
        Item::new(&Arc::from(name), &rule, false, cost)
    }

    /// A token bucket's item for requests of `cost`.
    fn costly(name: &str, capacity: f64, refill_per_sec: f64, cost: f64) -> Item {
        let rule = Rule::TokenBucket {
            capacity,
            refill_per_sec,
        };
        Item::new(&Arc::from(name), &rule, false, cost)
    }

    fn written(h: &RateHeaders) -> Vec<(String, String)> {
        let mut map = HeaderMap::new();
        h.write(&mut map);
        let mut v: Vec<_> = map
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn whole_numbers_round_as_floor_and_ceil_do() {
        let xs = [
            -1.5,
            -0.0,
            0.0,
            1e-300,
            0.4,
            0.5,
            1.0,
            1.0000001,
            2.9999999999,
            3.0,
            4095.5,
            9_007_199_254_740_993.0,
            1.8e19,
            1e300,
            f64::INFINITY,
        ];
        for x in xs {
            assert_eq!(whole_down(x), x.floor().max(0.0) as u64, "{x}");
            assert_eq!(whole_secs(x), x.ceil().max(0.0) as u64, "{x}");
        }
        assert_eq!((whole_down(f64::NAN), whole_secs(f64::NAN)), (0, 0));
        assert_eq!(whole_secs(f64::NEG_INFINITY), 0);
    }

    #[test]
    fn header_values_round_honestly() {
        let mut it = bucket("a", 5.0, 1.0);
        it.state = Some((3.999, 1.2));
        let h = RateHeaders::new(HeaderStyle::Both, smallvec::smallvec![it], None);
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
                .collect()
        };
        assert_eq!(
            written(&h),
            pairs(&[
                ("ratelimit", "\"a\";r=3;t=2"),
                ("ratelimit-policy", "\"a\";q=5;w=5"),
                ("x-ratelimit-limit", "5"),
                ("x-ratelimit-remaining", "3"),
                ("x-ratelimit-reset", "2"),
            ])
        );
        assert_eq!(h.remaining(), Some(3));
        // A ten-billionth of a token short is within the ½ µs of refill
        // the stores admit beyond the burst: the fourth request passes.
        assert_eq!(remaining_of(bucket("a", 5.0, 1.0), 3.9999999999), Some(4));
    }

    #[test]
    fn windows_round_up_and_concurrency_has_none() {
        // 10 per second, burst 5: refilled in half a second, written w=1
        // (a client sending q per w is never refused).
        let mut fast = bucket("fast", 5.0, 10.0);
        fast.state = Some((5.0, 0.0));
        let mut slots = slots("9.slots_X-y", 3.0, 1.0);
        slots.state = Some((2.0, 0.0));
        let mut hidden = bucket("shadowed", 1.0, 1.0);
        hidden.shadow = true;
        hidden.state = Some((0.0, 1.0));
        let h = RateHeaders::new(
            HeaderStyle::Ietf,
            smallvec::smallvec![fast, slots, hidden],
            None,
        );
        let mut map = HeaderMap::new();
        h.write(&mut map);
        assert_eq!(
            map["ratelimit-policy"], "\"fast\";q=5;w=1, \"9.slots_X-y\";q=3",
            "a shadow limit is no part of the contract"
        );
        assert_eq!(
            map["ratelimit"],
            "\"fast\";r=5;t=0, \"9.slots_X-y\";r=2;t=0"
        );
        assert!(map.get("x-ratelimit-limit").is_none(), "ietf only");
    }

    #[test]
    fn a_local_decision_claims_no_remaining() {
        let mut it = bucket("a", 10.0, 1.0);
        it.state = Some((4.0, 6.0));
        let mut h = RateHeaders::new(HeaderStyle::Both, smallvec::smallvec![it], None);
        h.local = true;
        let mut map = HeaderMap::new();
        h.write(&mut map);
        assert_eq!(map["x-ratelimit-limit"], "10");
        assert_eq!(map["ratelimit-policy"], "\"a\";q=10;w=10");
        for absent in ["x-ratelimit-remaining", "x-ratelimit-reset", "ratelimit"] {
            assert!(map.get(absent).is_none(), "{absent}");
        }
        assert_eq!(h.remaining(), None);
    }

    /// The case of issue 24: `A` (100, 1/h) with 15 left and `B` (5, 1/s)
    /// with half a token. `A` has the most room for its size, but `B`
    /// refuses the next request: `B` is reported, with 0.
    #[test]
    fn reports_the_limit_that_refuses_first() {
        let mut a = bucket("a", 100.0, 1.0 / 3600.0);
        a.state = Some((14.0, 86.0 * 3600.0));
        let mut b = bucket("b", 5.0, 1.0);
        b.state = Some((0.5, 4.5));
        let h = RateHeaders::new(HeaderStyle::Both, smallvec::smallvec![a, b], None);
        let mut map = HeaderMap::new();
        h.write(&mut map);
        assert_eq!(map["x-ratelimit-limit"], "5");
        assert_eq!(map["x-ratelimit-remaining"], "0");
        assert_eq!(map["x-ratelimit-reset"], "5");
        assert_eq!(map["ratelimit"], "\"a\";r=14;t=309600, \"b\";r=0;t=5");
        assert_eq!((h.remaining(), h.left()), (Some(0), 0));
    }

    /// Counts are whole requests of the route's cost, `Limit` and `q`
    /// included; a concurrency limit's requests take one slot each.
    #[test]
    fn counts_are_requests_of_the_cost() {
        let mut big = costly("big", 10.0, 1.0, 3.0);
        big.state = Some((9.0, 1.0));
        let mut slots = slots("slots", 4.0, 3.0);
        slots.state = Some((2.0, 30.0));
        let h = RateHeaders::new(
            HeaderStyle::Both,
            smallvec::smallvec![big.clone(), slots],
            None,
        );
        let mut map = HeaderMap::new();
        h.write(&mut map);
        assert_eq!(map["x-ratelimit-limit"], "4", "the slots: 2 requests left");
        assert_eq!(map["x-ratelimit-remaining"], "2");
        assert_eq!(map["ratelimit-policy"], "\"big\";q=3;w=10, \"slots\";q=4");
        assert_eq!(map["ratelimit"], "\"big\";r=3;t=1, \"slots\";r=2;t=30");
        // 8.9 units are 2 requests of 3, not 2.97.
        assert_eq!(remaining_of(big, 8.9), Some(2));
    }

    /// Ties go to the limit longest from full; shadow limits never report
    /// unless they are all the route has; a refund re-chooses.
    #[test]
    fn ties_shadows_and_refunds() {
        let mut window = bucket("window", 5.0, 5.0);
        window.state = Some((5.0, 0.0));
        let mut hourly = bucket("hourly", 100.0, 1.0 / 3600.0);
        hourly.state = Some((5.0, 95.0 * 3600.0));
        let items = smallvec::smallvec![window.clone(), hourly.clone()];
        let h = RateHeaders::new(HeaderStyle::Legacy, items, None);
        assert_eq!(h.reported, 1, "5 and 5: the hourly bucket's are the last");

        let mut shadow = bucket("shadow", 10.0, 1.0);
        shadow.shadow = true;
        shadow.state = Some((0.0, 10.0));
        let items = smallvec::smallvec![shadow.clone(), window.clone()];
        let mut h = RateHeaders::new(HeaderStyle::Legacy, items, None);
        assert_eq!((h.reported, h.remaining()), (1, Some(5)));
        // A refund gives the hourly bucket 40: still the window (5) first.
        let mut h2 = RateHeaders::new(
            HeaderStyle::Legacy,
            smallvec::smallvec![window, hourly],
            None,
        );
        let refunded = LimitState {
            enough: true,
            remaining: 40.0,
            wait: 0.0,
            reset: 60.0 * 3600.0,
            capacity: 100.0,
        };
        h2.update(1, &refunded);
        assert_eq!((h2.reported, h2.remaining()), (0, Some(5)));
        // Only shadow limits: the one with the fewest left.
        let mut other = bucket("other", 10.0, 1.0);
        other.shadow = true;
        other.state = Some((3.0, 7.0));
        h = RateHeaders::new(
            HeaderStyle::Legacy,
            smallvec::smallvec![other, shadow],
            None,
        );
        assert_eq!((h.reported, h.remaining()), (1, Some(0)));
        // A refusal reports the limit it is told.
        let mut empty = bucket("empty", 5.0, 1.0);
        empty.state = Some((0.2, 4.8));
        let mut full = bucket("full", 5.0, 1.0);
        full.state = Some((5.0, 0.0));
        h = RateHeaders::new(
            HeaderStyle::Legacy,
            smallvec::smallvec![full, empty],
            Some(1),
        );
        assert_eq!((h.reported, h.remaining()), (1, Some(0)));
    }

    #[test]
    fn parts_of_a_request_in_two_places_are_none() {
        assert_eq!(apart(0.5, 0.6, 1.0), 0.0);
        assert_eq!(apart(97.0, 2.0, 3.0), 96.0);
        assert_eq!(apart(-1.0, 4.0, 2.0), 4.0);
        assert_eq!(requests(7.0, 0.0), 7, "a cost below one counts as one");
    }

    #[test]
    fn a_refusal_reports_the_longest_wait() {
        let s = |remaining, wait| LimitState {
            enough: wait == 0.0,
            remaining,
            wait,
            reset: 0.0,
            capacity: 10.0,
        };
        let admitted = [s(5.0, 0.0), s(2.0, 0.0)];
        assert_eq!(refusing(&admitted, |_| false), None);
        let refused = [s(0.0, 9.0), s(0.5, 3.0)];
        assert_eq!(refusing(&refused, |_| false), Some(0));
        assert_eq!(
            refusing(&refused, |i| i == 0),
            Some(1),
            "a shadow limit never sets Retry-After"
        );
    }
}
