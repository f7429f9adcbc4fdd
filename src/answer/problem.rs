//! `application/problem+json` bodies (RFC 9457) of refusals that are
//! written once per limit, apart from the request path's modules: a route
//! keeps its limits' bodies, and the response builder reads them.

use std::cell::RefCell;
use std::fmt;
use std::fmt::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::StatusCode;
use http::header::HeaderValue;

/// The problem type of a refusal by a rate limit.
pub(crate) const RATE_LIMITED: &str = "urn:fleetlimit:rate-limited";

/// Appends `s` as a JSON string literal.
pub(crate) fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    // Runs of characters that need no escape are copied whole.
    let mut from = 0;
    for (i, b) in s.bytes().enumerate() {
        if b != b'"' && b != b'\\' && b >= 0x20 {
            continue;
        }
        out.push_str(&s[from..i]);
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            _ => {
                let _ = write!(out, "\\u{:04x}", b);
            }
        }
        from = i + 1;
    }
    out.push_str(&s[from..]);
    out.push('"');
}

/// Slots of each thread's [`RECENT`] bodies.
const RECENT_SLOTS: usize = 16;

thread_local! {
    /// Bodies of waits longer than [`KEPT_BODIES`] s built lately on this
    /// thread, by limit id and wait: a handful per thread, whatever the
    /// traffic.
    static RECENT: RefCell<[Option<(u64, u64, Bytes)>; RECENT_SLOTS]> =
        const { RefCell::new([const { None }; RECENT_SLOTS]) };
}

/// How many `Retry-After` values each limit keeps its `429` body for.
const KEPT_BODIES: usize = 64;

/// A limit's `429` bodies: the text around the two `Retry-After` numbers
/// is written once, and the bodies of waits of 1 to [`KEPT_BODIES`] s are
/// kept once built and shared (a clone is a reference count): a refused
/// client is told the same few numbers again and again. Longer waits are
/// one allocation each, unless the thread built the same one lately.
pub(crate) struct RefusalBodies {
    /// Unique in the process: names this limit's bodies in each thread's
    /// [`RECENT`] (an address could be reused by a later limit).
    id: u64,
    /// Up to the number in `detail`.
    head: Box<str>,
    /// From after that number to the one of `retry_after`.
    mid: Box<str>,
    kept: Box<[OnceLock<Bytes>; KEPT_BODIES]>,
}

impl fmt::Debug for RefusalBodies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kept = self.kept.iter().filter(|b| b.get().is_some()).count();
        write!(f, "RefusalBodies({kept} kept)")
    }
}

impl RefusalBodies {
    /// The bodies of limit `name`: what a `problem+json` body of the limit
    /// reads (see `answer/rate.rs`).
    pub(crate) fn new(name: &str) -> Self {
        let status = StatusCode::TOO_MANY_REQUESTS;
        let mut head = String::new();
        head.push_str("{\"type\":");
        push_json_str(&mut head, RATE_LIMITED);
        head.push_str(",\"title\":");
        push_json_str(&mut head, status.canonical_reason().unwrap_or(""));
        head.push_str(",\"status\":");
        head.push_str(status.as_str());
        head.push_str(",\"detail\":");
        // The number is digits, escaped as itself: the detail's JSON is its
        // parts' JSON, quotes aside.
        let mut detail = String::new();
        push_json_str(
            &mut detail,
            &format!("rate limit {name:?} exceeded; retry in "),
        );
        head.push_str(&detail[..detail.len() - 1]);
        let mut mid = String::new();
        push_json_str(&mut mid, " s");
        mid.remove(0);
        mid.push_str(",\"limit\":");
        push_json_str(&mut mid, name);
        mid.push_str(",\"retry_after\":");
        static IDS: AtomicU64 = AtomicU64::new(0);
        Self {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            head: head.into(),
            mid: mid.into(),
            kept: Box::new(std::array::from_fn(|_| OnceLock::new())),
        }
    }

    /// Unique in the process: whose answers a thread keeps.
    pub(super) fn id(&self) -> u64 {
        self.id
    }

    /// The `429` body for a wait of `retry` seconds.
    pub(crate) fn get(&self, retry: u64) -> Bytes {
        let kept = usize::try_from(retry)
            .ok()
            .and_then(|r| self.kept.get(r.wrapping_sub(1)));
        match kept {
            Some(cell) => cell.get_or_init(|| self.build(retry)).clone(),
            None => self.recent(retry),
        }
    }

    /// A longer wait's body: the one this thread built last for the same
    /// limit and wait, if still in its slot (a client hammering a limit is
    /// told the same wait for a whole second), else a new one.
    fn recent(&self, retry: u64) -> Bytes {
        RECENT.with(|recent| {
            let mut recent = recent.borrow_mut();
            let slot = &mut recent[((self.id ^ retry) % RECENT_SLOTS as u64) as usize];
            match slot {
                Some((id, r, body)) if *id == self.id && *r == retry => body.clone(),
                _ => slot.insert((self.id, retry, self.build(retry))).2.clone(),
            }
        })
    }

    fn build(&self, retry: u64) -> Bytes {
        let mut digits = [0u8; 20];
        let n = decimal(retry, &mut digits);
        let mut body = String::with_capacity(self.head.len() + self.mid.len() + 2 * n.len() + 1);
        body.push_str(&self.head);
        body.push_str(n);
        body.push_str(&self.mid);
        body.push_str(n);
        body.push('}');
        Bytes::from(body)
    }
}

/// `n` in decimal, written at the end of `buf` (no `format!` machinery:
/// the request path writes numbers this way).
pub(crate) fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &str {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&buf[at..]).unwrap_or("0")
}

/// A JSON string literal.
pub(crate) fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    push_json_str(&mut out, s);
    out
}

/// `application/problem+json`
pub(super) static PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// An `application/problem+json` body (RFC 9457) of `kind`, with `extra`
/// members (values already JSON).
pub(super) fn problem_body(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
    extra: &[(&str, String)],
) -> Bytes {
    // One buffer for the whole body.
    let mut body = String::with_capacity(96 + detail.len());
    body.push_str("{\"type\":");
    push_json_str(&mut body, kind);
    body.push_str(",\"title\":");
    push_json_str(&mut body, title);
    body.push_str(",\"status\":");
    body.push_str(status.as_str());
    body.push_str(",\"detail\":");
    push_json_str(&mut body, detail);
    for (k, v) in extra {
        body.push(',');
        push_json_str(&mut body, k);
        body.push(':');
        body.push_str(v);
    }
    body.push('}');
    Bytes::from(body)
}

/// The `429` body of limit `name` for a wait of `retry` seconds, as
/// [`RefusalBodies`] writes it faster.
#[cfg(test)]
pub(super) fn refusal_body(name: &str, retry: u64) -> Bytes {
    let status = StatusCode::TOO_MANY_REQUESTS;
    problem_body(
        status,
        crate::RefusalReason::LimitExceeded.problem_type(),
        status.canonical_reason().unwrap_or(""),
        &format!("rate limit {name:?} exceeded; retry in {retry} s"),
        &[
            ("limit", json_str(name)),
            ("retry_after", retry.to_string()),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::{RefusalReason, Rejection};
    use std::sync::Arc;

    #[test]
    fn problem_bodies_are_json() {
        let r = Rejection::problem(
            RefusalReason::LimitExceeded,
            StatusCode::TOO_MANY_REQUESTS,
            &Arc::from("a"),
            "say \"hi\"\n",
            &[("limit", json_str("a"))],
        );
        let body = std::str::from_utf8(&r.body).unwrap();
        assert_eq!(
            body,
            r#"{"type":"urn:fleetlimit:rate-limited","title":"Too Many Requests","status":429,"detail":"say \"hi\"\u000a","limit":"a"}"#
        );
    }

    #[test]
    fn refusal_bodies_are_written_as_problem_bodies() {
        for name in ["a", "per-key", "9.slots_X-y"] {
            let bodies = RefusalBodies::new(name);
            for retry in [1, 2, 9, 10, 64, 65, 3600, u64::MAX / 2] {
                let expected = refusal_body(name, retry);
                assert_eq!(bodies.get(retry), expected, "{name} {retry}");
                assert_eq!(bodies.get(retry), expected, "{name} {retry}, kept");
            }
        }
        // Two limits refusing the same long wait, in turn: each its own.
        let (a, b) = (RefusalBodies::new("a"), RefusalBodies::new("b"));
        for _ in 0..3 {
            assert_eq!(a.get(3600), refusal_body("a", 3600));
            assert_eq!(b.get(3600), refusal_body("b", 3600));
            assert_eq!(a.get(3599), refusal_body("a", 3599));
        }
        assert_eq!(
            RefusalBodies::new("a").get(3),
            r#"{"type":"urn:fleetlimit:rate-limited","title":"Too Many Requests","status":429,"detail":"rate limit \"a\" exceeded; retry in 3 s","limit":"a","retry_after":3}"#
        );
    }
}
