//! What a response says about when to send next: `Retry-After`, the IETF
//! `RateLimit` field, and `X-RateLimit-Remaining`/`X-RateLimit-Reset`.
//!
//! Every header is optional and may be malformed: an unreadable value is
//! ignored (as if absent), never an error.

use std::time::{Duration, SystemTime};

use http::HeaderMap;
use http::header::RETRY_AFTER;

/// A reset written as a Unix time rather than a number of seconds (some
/// servers send `X-RateLimit-Reset` that way). No delta is this large.
const EPOCH_THRESHOLD: u64 = 1_000_000_000;

/// What one response advises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Advice {
    /// `Retry-After`, as a wait from now.
    pub(super) retry_after: Option<Duration>,
    /// The quota is spent: wait this long before the next request
    /// (the longest reset among the quotas that say remaining 0).
    pub(super) exhausted_for: Option<Duration>,
}

impl Advice {
    pub(super) fn read(headers: &HeaderMap) -> Self {
        let retry_after = headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let from_draft = headers
            .get_all("ratelimit")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(parse_ratelimit)
            .filter(|q| q.remaining == Some(0))
            .filter_map(|q| q.reset)
            .max();
        let from_x = match (
            number(headers, "x-ratelimit-remaining"),
            number(headers, "x-ratelimit-reset"),
        ) {
            (Some(0), Some(reset)) => Some(reset_delta(reset)),
            _ => None,
        };
        Self {
            retry_after,
            exhausted_for: from_draft.into_iter().chain(from_x).max(),
        }
    }

    /// How long a refusal asks the client to wait: `Retry-After` first,
    /// else the reset of the spent quota.
    pub(super) fn refusal_wait(&self) -> Option<Duration> {
        self.retry_after.or(self.exhausted_for)
    }
}

fn number(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

fn reset_delta(reset: u64) -> Duration {
    if reset < EPOCH_THRESHOLD {
        return Duration::from_secs(reset);
    }
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(reset);
    at.duration_since(SystemTime::now()).unwrap_or_default()
}

/// `Retry-After: 120` or `Retry-After: Wed, 21 Oct 2015 07:28:00 GMT`
/// (RFC 9110 §10.2.3). A date in the past is a wait of zero.
fn parse_retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(SystemTime::now()).unwrap_or_default())
}

/// One quota of a `RateLimit` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Quota {
    remaining: Option<u64>,
    reset: Option<Duration>,
}

/// `RateLimit: "default";r=0;t=5, "burst";r=3;t=1` (draft-ietf-httpapi-
/// ratelimit-headers, a structured-field List of Items whose parameters `r`
/// and `t` are the remaining quota and the seconds until it resets).
/// The earlier drafts' dictionary, `limit=10, remaining=0, reset=5`, is read
/// too, as one quota.
fn parse_ratelimit(v: &str) -> Vec<Quota> {
    let mut quotas = Vec::new();
    let mut legacy = Quota {
        remaining: None,
        reset: None,
    };
    for member in split_outside_quotes(v, ',') {
        let mut parts = split_outside_quotes(member, ';').into_iter();
        let item = parts.next().unwrap_or("").trim();
        if let Some((k, val)) = item.split_once('=') {
            // The older dictionary form: `remaining=0` is a member, not an item.
            let n = val.trim().parse::<u64>().ok();
            match k.trim() {
                "remaining" => legacy.remaining = n,
                "reset" => legacy.reset = n.map(Duration::from_secs),
                _ => {}
            }
            continue;
        }
        let mut q = Quota {
            remaining: None,
            reset: None,
        };
        for param in parts {
            let Some((k, val)) = param.split_once('=') else {
                continue;
            };
            let n = val.trim().parse::<u64>().ok();
            match k.trim() {
                "r" => q.remaining = n,
                "t" => q.reset = n.map(Duration::from_secs),
                _ => {}
            }
        }
        quotas.push(q);
    }
    if legacy.remaining.is_some() || legacy.reset.is_some() {
        quotas.push(legacy);
    }
    quotas
}

/// Splits at `sep` except inside a quoted string (with `\"` escapes): a
/// policy name may contain commas and semicolons.
fn split_outside_quotes(s: &str, sep: char) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
        } else if c == sep && !quoted {
            out.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    out.push(&s[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn retry_after_seconds_and_dates() {
        let a = Advice::read(&headers(&[("retry-after", " 7 ")]));
        assert_eq!(a.retry_after, Some(Duration::from_secs(7)));
        let past = Advice::read(&headers(&[(
            "retry-after",
            "Wed, 21 Oct 2015 07:28:00 GMT",
        )]));
        assert_eq!(past.retry_after, Some(Duration::ZERO));
        let future = SystemTime::now() + Duration::from_secs(120);
        let date = httpdate::fmt_http_date(future);
        let a = Advice::read(&headers(&[("retry-after", &date)]));
        let w = a.retry_after.unwrap();
        assert!(
            w > Duration::from_secs(110) && w <= Duration::from_secs(120),
            "{w:?}"
        );
        for bad in ["-1", "soon", "1.5", ""] {
            assert_eq!(
                Advice::read(&headers(&[("retry-after", bad)])),
                Advice::default(),
                "{bad}"
            );
        }
    }

    #[test]
    fn draft_field_spent_quotas_only() {
        let a = Advice::read(&headers(&[(
            "ratelimit",
            r#""per;min,ute";r=0;t=40, "burst";r=3;t=1, day;r=0;t=9"#,
        )]));
        assert_eq!(a.exhausted_for, Some(Duration::from_secs(40)));
        let a = Advice::read(&headers(&[("ratelimit", r#""default";r=2;t=5"#)]));
        assert_eq!(a.exhausted_for, None, "quota left");
        // Separate field lines are one list.
        let a = Advice::read(&headers(&[
            ("ratelimit", r#""a";r=1;t=5"#),
            ("ratelimit", r#""b";t=3;r=0"#),
        ]));
        assert_eq!(a.exhausted_for, Some(Duration::from_secs(3)));
        let a = Advice::read(&headers(&[("ratelimit", "limit=10, remaining=0, reset=6")]));
        assert_eq!(a.exhausted_for, Some(Duration::from_secs(6)), "older draft");
        for bad in [
            r#""a";r=x;t=5"#,
            r#""a";r=0"#,
            r#""a;r=0;t=5"#,
            ";;,,=",
            "\"\\",
        ] {
            assert_eq!(
                Advice::read(&headers(&[("ratelimit", bad)])).exhausted_for,
                None,
                "{bad}"
            );
        }
    }

    #[test]
    fn x_ratelimit_pair() {
        let a = Advice::read(&headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "4"),
        ]));
        assert_eq!(a.exhausted_for, Some(Duration::from_secs(4)));
        assert_eq!(a.refusal_wait(), Some(Duration::from_secs(4)));
        let a = Advice::read(&headers(&[
            ("x-ratelimit-remaining", "1"),
            ("x-ratelimit-reset", "4"),
        ]));
        assert_eq!(a.exhausted_for, None);
        // A Unix time, as some servers send it.
        let at = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 30;
        let a = Advice::read(&headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &at.to_string()),
        ]));
        let w = a.exhausted_for.unwrap();
        assert!(
            w > Duration::from_secs(25) && w <= Duration::from_secs(30),
            "{w:?}"
        );
        // Retry-After wins for a refusal; the longest spent quota for pacing.
        let a = Advice::read(&headers(&[
            ("retry-after", "2"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "4"),
            ("ratelimit", r#""d";r=0;t=6"#),
        ]));
        assert_eq!(a.refusal_wait(), Some(Duration::from_secs(2)));
        assert_eq!(a.exhausted_for, Some(Duration::from_secs(6)));
    }
}
