//! A `429`'s header map and body, kept per thread: a client hammering a
//! limit is refused with the same numbers for a whole second, so the map
//! is built once and cloned (two allocations) rather than built again
//! (an allocation and five to seven inserts, each hashing its name).

use std::cell::RefCell;
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use http::header::HeaderValue;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};

use super::problem::{PROBLEM_JSON, RefusalBodies};
use super::rate::{RateHeaders, number};

/// Slots of each thread's [`KEPT`] answers.
const SLOTS: usize = 16;

/// One kept answer: whose, for which numbers, and what it is.
struct Kept {
    id: u64,
    retry: u64,
    print: [u64; 5],
    /// The route's own policy, if written: held, so no other can take its
    /// address.
    policy: Option<Arc<HeaderValue>>,
    headers: HeaderMap,
    body: Bytes,
}

thread_local! {
    /// The answers built lately on this thread, by limit id, wait and
    /// header numbers: a handful per thread, whatever the traffic.
    static KEPT: RefCell<[Option<Kept>; SLOTS]> = const { RefCell::new([const { None }; SLOTS]) };
}

/// The headers and body of a `429` of the limit `name` (whose bodies are
/// `bodies`) for a wait of `retry` s with these rate headers. Kept when
/// the headers report that limit alone (see [`RateHeaders::fingerprint`]);
/// built each time on a route of several limits.
pub(super) fn refusal(
    bodies: &RefusalBodies,
    name: &Arc<str>,
    retry: u64,
    h: &RateHeaders,
) -> (HeaderMap, Bytes) {
    let Some(print) = h.fingerprint(name) else {
        return build(bodies, retry, h);
    };
    let id = bodies.id();
    KEPT.with(|kept| {
        let mut kept = kept.borrow_mut();
        let slot = &mut kept[((id ^ retry ^ print[3]) % SLOTS as u64) as usize];
        let hit = matches!(&*slot, Some(k) if k.id == id
            && k.retry == retry
            && k.print == print
            && ptr(&k.policy) == ptr(&h.policy));
        if !hit {
            *slot = None;
        }
        let k = slot.get_or_insert_with(|| {
            let (headers, body) = build(bodies, retry, h);
            Kept {
                id,
                retry,
                print,
                policy: h.policy.clone(),
                headers,
                body,
            }
        });
        (k.headers.clone(), k.body.clone())
    })
}

fn ptr(p: &Option<Arc<HeaderValue>>) -> Option<*const HeaderValue> {
    p.as_ref().map(Arc::as_ptr)
}

fn build(bodies: &RefusalBodies, retry: u64, h: &RateHeaders) -> (HeaderMap, Bytes) {
    // Room for a refusal's headers, `[headers] style = "both"` included.
    let mut headers = HeaderMap::with_capacity(8);
    headers.insert(CONTENT_TYPE, PROBLEM_JSON.clone());
    headers.insert(RETRY_AFTER, number(retry));
    h.write(&mut headers);
    let body = bodies.get(retry);
    // The length axum (or hyper) would add for this whole body, kept with
    // the rest: added to a clone, which has no room to spare, it would
    // grow the clone (a reallocation) after a value of its own had been
    // formatted. The refusal hook is shown the map without it (see
    // `Rejection::shape`).
    headers.insert(CONTENT_LENGTH, number(body.len() as u64));
    (headers, body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{LimitState, Rule};
    use crate::answer::{HeaderStyle, Item};

    fn headers(name: &Arc<str>, style: HeaderStyle, remaining: f64, reset: f64) -> RateHeaders {
        let rule = Rule::TokenBucket {
            capacity: 10.0,
            refill_per_sec: 1.0,
        };
        let state = LimitState {
            enough: false,
            remaining,
            wait: 1.0,
            reset,
            capacity: 10.0,
        };
        let item = Item::new(name, &rule, false, 1.0).with(&state);
        RateHeaders::new(style, smallvec::smallvec![item], Some(0))
    }

    fn shown(map: &HeaderMap) -> Vec<(String, String)> {
        let mut v: Vec<_> = map
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_owned()))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_kept_answer_is_the_one_built() {
        let name: Arc<str> = Arc::from("k");
        let bodies = RefusalBodies::new("k");
        for style in [HeaderStyle::Legacy, HeaderStyle::Ietf, HeaderStyle::Both] {
            for (left, reset, retry) in [
                (0.0, 10.0, 1),
                (0.0, 10.0, 1),
                (2.0, 10.0, 1),
                (3.5, 6.2, 2),
                (0.0, 10.0, 1),
            ] {
                let h = headers(&name, style, left, reset);
                let (map, body) = refusal(&bodies, &name, retry, &h);
                let (want, want_body) = build(&bodies, retry, &h);
                assert_eq!(shown(&map), shown(&want), "{style:?} {left} {reset}");
                assert_eq!(body, want_body);
            }
        }
        let h = headers(&name, HeaderStyle::Legacy, 3.5, 6.2);
        let (map, _) = refusal(&bodies, &name, 2, &h);
        assert_eq!(map["x-ratelimit-remaining"], "3");
        assert_eq!(map["x-ratelimit-reset"], "7");
        assert_eq!(map["retry-after"], "2");
    }

    #[test]
    fn another_limit_of_the_same_numbers_is_told_its_own_name() {
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let (ba, bb) = (RefusalBodies::new("a"), RefusalBodies::new("b"));
        let (ma, _) = refusal(&ba, &a, 1, &headers(&a, HeaderStyle::Ietf, 0.0, 10.0));
        let (mb, body) = refusal(&bb, &b, 1, &headers(&b, HeaderStyle::Ietf, 0.0, 10.0));
        assert_eq!(ma["ratelimit"], "\"a\";r=0;t=10");
        assert_eq!(mb["ratelimit"], "\"b\";r=0;t=10");
        assert!(
            std::str::from_utf8(&body)
                .unwrap_or("")
                .contains("\"limit\":\"b\"")
        );
    }
}
