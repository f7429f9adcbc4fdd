//! Steps 1 and 2 at once for the commonest route: one limit on the
//! in-process store that needs nothing beside its bucket, on a route with
//! no refund handle and no shadow mode ([`Traits::lone`], worked out when
//! the policy is built from every field of its limit), without a cost
//! function. Its key is written into a per-thread buffer and its bucket
//! decided in place: no [`Pending`], no key of its own, no bucket list, no
//! boxed decision. Every answer is built by the functions the general path
//! (`prepare.rs`, `decide.rs`) builds it with; the tests below hold the two
//! side by side. On every log level: a subscriber that takes `DEBUG` gets
//! the decision's span around the same code.
//!
//! [`Pending`]: super::Pending
//! [`Traits::lone`]: crate::route::Traits

use std::cell::RefCell;
use std::net::IpAddr;

use http::Request;
use smallvec::smallvec;
use tracing::Span;

use super::account::outcome_of;
use super::{headers, prepare, trace, Admitted, Decided, Decision, Limiter};
use crate::algorithm::LimitState;
use crate::answer::{self as response, retry_after_secs, Item, RateHeaders};
use crate::record::Via;
use crate::route::{Limit, Policy};
use crate::store::MemoryStore;
use crate::RequestRef;

thread_local! {
    /// The key being decided on this thread (its text is needed only while
    /// the store looks it up).
    static KEY: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The decision of a request on a lone route (see the module guide);
/// `route`: its `MatchedPath`.
#[inline]
pub(super) fn decide<B>(
    l: &Limiter,
    req: &Request<B>,
    route: Option<&str>,
    policy: &Policy,
    memory: &MemoryStore,
) -> Decided {
    let Some(span) = trace::span(route) else {
        return Decided::Now(in_place(l, req, policy, memory, None));
    };
    span.record("limit", &*policy.limits[0].name);
    let d = span.in_scope(|| in_place(l, req, policy, memory, Some(&span)));
    trace::outcome(&span, &d);
    Decided::Now(d)
}

fn in_place<B>(
    l: &Limiter,
    req: &Request<B>,
    policy: &Policy,
    memory: &MemoryStore,
    span: Option<&Span>,
) -> Decision {
    let limit: &Limit = &policy.limits[0];
    let (headers, ext) = (req.headers(), req.extensions());
    let mut ip: Option<Option<IpAddr>> = None;
    let mut client_ip = || *ip.get_or_insert_with(|| l.client_ip.client_ip(headers, ext));
    let material = match prepare::material(l, limit, &RequestRef::new(req), &mut client_ip) {
        Ok(m) => m,
        Err(r) => return Decision::Reject(r),
    };
    let rule = limit.rule;
    // As `buckets` in decide.rs: a cost no bucket can ever hold (the
    // configuration refuses one above the route's own numbers; kept so
    // that both paths answer alike whatever it lets through).
    if f64::from(policy.cost) > rule.capacity() {
        return Decision::Reject(response::too_costly(limit, policy.cost, rule.capacity()));
    }
    let cost = f64::from(policy.cost);
    let headers = |s: &LimitState, refused_by| {
        let items = smallvec![Item::new(&limit.name, &rule, false, cost).with(s)];
        let mut headers = RateHeaders::new(l.header_style, items, refused_by);
        headers::route_policy(l, policy, [rule].iter(), policy.cost, &mut headers);
        headers
    };
    // A refusal is built while the key's text is at hand (its log line
    // names the key) and left here; the key buffer hands back only the
    // bucket's state, which is small to move.
    let mut refused = None;
    let mut decide = |key: &mut String| {
        let (_, id) = material.write_key(key, &limit.key_head, l.core.key_secret.as_ref());
        if let Some(span) = span {
            trace::key(span, id, key);
        }
        let (allowed, s) = memory.check_key(key, rule, false, cost);
        let outcome = outcome_of(policy, false, 0, allowed, Some(s.enough), Via::Store);
        crate::metrics::decided(
            &policy.metrics,
            std::iter::once(&limit.name),
            std::iter::once((outcome, false)),
        );
        if !allowed {
            let (h, retry) = (headers(&s, Some(0)), retry_after_secs(s.wait));
            refused = Some(response::refusal(limit, id.of(key), h, retry, false, false));
        }
        s
    };
    // Taken already only if a log line of this thread's decision came back
    // here (a subscriber calling the layer): then a key of its own.
    let s = KEY.with(|key| match key.try_borrow_mut() {
        Ok(mut key) => decide(&mut key),
        Err(_) => decide(&mut String::new()),
    });
    match refused {
        Some(r) => Decision::Reject(r),
        None => Decision::Admit(Admitted {
            headers: Some(headers(&s, None)),
            ..Admitted::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use axum::extract::ConnectInfo;
    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};

    use std::ops::ControlFlow;

    use super::super::{Decided, Extras};
    use super::*;
    use crate::config::Config;

    fn limiter(toml: &str) -> Arc<Limiter> {
        let cfg = Config::from_toml_str(toml).unwrap();
        let store = Arc::new(MemoryStore::new(cfg.memory_max_keys));
        Arc::new(Limiter::new(
            &cfg,
            store.clone(),
            Some(store),
            Extras::none(),
        ))
    }

    /// What a client sees of a decision: status, sorted headers, body.
    type Seen = (StatusCode, Vec<(String, String)>, Bytes);

    fn seen(d: Decision) -> Seen {
        let (status, headers, body) = match d {
            Decision::Admit(a) => {
                let mut h = HeaderMap::new();
                if let Some(rh) = a.headers {
                    rh.write(&mut h);
                }
                (StatusCode::OK, h, Bytes::new())
            }
            Decision::Reject(r) => {
                let res = r.into_response();
                (res.status(), res.headers().clone(), res.into_body())
            }
        };
        let mut headers: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        headers.sort();
        (status, headers, body)
    }

    /// The general path's answer (`prepare.rs`, then `decide.rs`).
    fn general(l: &Arc<Limiter>, req: &Request<()>) -> Seen {
        seen(match prepare::prepare(l, req) {
            ControlFlow::Break(d) => d,
            ControlFlow::Continue(p) => match l.decide(p) {
                Decided::Now(d) => d,
                _ => panic!("the in-process store decides at once"),
            },
        })
    }

    /// This module's answer, through the spine.
    fn lone(l: &Arc<Limiter>, req: &Request<()>) -> Seen {
        assert!(is_lone(l, req), "a lone route");
        match l.handle(req) {
            Decided::Now(d) => seen(d),
            _ => panic!("decided at once"),
        }
    }

    /// Whether the spine decides `req` here.
    fn is_lone(l: &Limiter, req: &Request<()>) -> bool {
        let policy = prepare::route(l, req).policy.unwrap();
        l.lone.is_some() && policy.traits.lone
    }

    fn req(key: Option<&str>, peer: Option<&str>) -> Request<()> {
        let mut r = Request::get("/");
        if let Some(k) = key {
            r = r.header("x-api-key", k);
        }
        let mut r = r.body(()).unwrap();
        if let Some(p) = peer {
            r.extensions_mut()
                .insert(ConnectInfo(p.parse::<std::net::SocketAddr>().unwrap()));
        }
        r
    }

    /// Two limiters of one configuration, one answering by the general
    /// path and one by this one, see the same requests: every answer
    /// (admitted or refused, headers, body) is the same.
    async fn same_answers(limit: &str, extra: &str, requests: &[(Option<&str>, Option<&str>)]) {
        let toml = format!("{extra}\n[limits.k]\n{limit}\n[default]\nlimits = [\"k\"]\n");
        let (a, b) = (limiter(&toml), limiter(&toml));
        let mut statuses = Vec::new();
        for round in 0..3 {
            for &(key, peer) in requests {
                let r = req(key, peer);
                let (g, o) = (general(&a, &r), lone(&b, &r));
                assert_eq!(g, o, "round {round}, key {key:?}, peer {peer:?}, {toml}");
                statuses.push(g.0.as_u16());
            }
            tokio::time::advance(Duration::from_millis(700)).await;
        }
        // Both admitted and refused answers were compared.
        assert!(
            statuses.contains(&200) && statuses.contains(&429),
            "{statuses:?}"
        );
    }

    const KEYS: &[(Option<&str>, Option<&str>)] = &[
        (Some("a"), None),
        (Some("a"), None),
        (Some("b"), None),
        (Some("a"), None),
        (Some("a"), None),
        (Some("b"), None),
        (None, None),
        (None, Some("10.0.0.1:4000")),
    ];

    #[tokio::test(start_paused = true)]
    async fn token_bucket_answers_as_the_general_path() {
        let limit = "key = \"header:x-api-key\"\ncapacity = 3\nrefill = \"1/s\"";
        same_answers(limit, "", KEYS).await;
        let both = "[headers]\nstyle = \"both\"";
        same_answers(limit, both, KEYS).await;
        let ip = "key = \"header:x-api-key\"\non_missing = \"ip\"\ncapacity = 2\nrefill = \"1/s\"";
        same_answers(ip, both, KEYS).await;
    }

    #[tokio::test(start_paused = true)]
    async fn windows_answer_as_the_general_path() {
        let both = "[headers]\nstyle = \"both\"";
        for algorithm in ["fixed-window", "sliding-window"] {
            let limit = format!(
                "key = \"header:x-api-key\"\nalgorithm = \"{algorithm}\"\nlimit = 3\nwindow = \"2s\""
            );
            same_answers(&limit, both, KEYS).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn ip_keys_and_long_keys_answer_as_the_general_path() {
        let long = "k".repeat(10_000);
        let requests = [
            (None, Some("10.0.0.1:4000")),
            (None, Some("[2001:db8::1]:4000")),
            (None, None),
            (Some(long.as_str()), Some("10.0.0.1:4000")),
            (None, Some("10.0.0.1:4001")),
        ];
        let ip = "key = \"ip\"\ncapacity = 2\nrefill = \"1/s\"";
        same_answers(ip, "", &requests).await;
        let header = "key = \"header:x-api-key\"\ncapacity = 2\nrefill = \"1/s\"";
        let long_keys = [
            (Some(long.as_str()), None),
            (Some(long.as_str()), None),
            (Some("short"), None),
        ];
        same_answers(header, "", &long_keys).await;
    }

    /// Routes that need more than their bucket take the general path.
    #[tokio::test(start_paused = true)]
    async fn only_lone_routes_are_decided_here() {
        let base = "key = \"header:x-api-key\"\ncapacity = 3\nrefill = \"1/s\"";
        for (limit, route) in [
            ("mode = \"shadow\"", ""),
            ("", "refund = true"),
            ("on_exceed = \"delay\"\ndelay = \"2s\"", ""),
            ("count = \"failures\"", ""),
        ] {
            let toml =
                format!("[limits.k]\n{base}\n{limit}\n[default]\nlimits = [\"k\"]\n{route}\n");
            let l = limiter(&toml);
            assert!(!is_lone(&l, &req(Some("a"), None)), "{toml}");
        }
        let two =
            format!("[limits.k]\n{base}\n[limits.j]\n{base}\n[default]\nlimits = [\"k\", \"j\"]\n");
        let l = limiter(&two);
        assert!(!is_lone(&l, &req(Some("a"), None)));
    }
}
