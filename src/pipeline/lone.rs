//! Steps 1 and 2 at once for the commonest route: one limit on the
//! in-process store that needs nothing beside its bucket (see
//! [`Traits::lone`](crate::route::Traits)), on a route with no refund
//! handle, no shadow mode and no cost function. Its key is written into a
//! per-thread buffer and its bucket decided in place: no [`Pending`], no
//! key of its own, no bucket list, no boxed decision. Every answer is built
//! by the functions the general path (`prepare.rs`, `decide.rs`) builds it
//! with; the tests below hold the two side by side.
//!
//! [`Pending`]: super::Pending

use std::cell::RefCell;
use std::net::IpAddr;

use http::Request;
use smallvec::smallvec;

use super::decide::outcome_of;
use super::{Admitted, Decision, Limiter};
use crate::answer::{self as response, retry_after_secs, Item, RateHeaders};
use crate::record::Via;
use crate::route::Policy;
use crate::store::MemoryStore;
use crate::RequestRef;

thread_local! {
    /// The key being decided on this thread (its text is needed only while
    /// the store looks it up).
    static KEY: RefCell<String> = const { RefCell::new(String::new()) };
}

impl Limiter {
    /// The in-process store, when it decides `policy` here.
    #[inline]
    pub(super) fn lone(&self, policy: &Policy) -> Option<&MemoryStore> {
        let plain = policy.traits.lone && !policy.refund && !policy.shadow;
        // A subscriber that takes DEBUG gets the general path's span.
        if !plain || !self.cost_fns.is_empty() || tracing::level_enabled!(tracing::Level::DEBUG) {
            return None;
        }
        self.core.in_process.as_deref()
    }

    /// The decision of a request on a `lone` route (see the module guide).
    pub(super) fn decide_lone<B>(
        &self,
        req: &Request<B>,
        policy: &Policy,
        memory: &MemoryStore,
    ) -> Decision {
        let limit = &policy.limits[0];
        let (headers, ext) = (req.headers(), req.extensions());
        let mut ip: Option<Option<IpAddr>> = None;
        let mut client_ip = || *ip.get_or_insert_with(|| self.client_ip.client_ip(headers, ext));
        let material = match self.material(limit, &RequestRef::new(req), &mut client_ip) {
            Ok(m) => m,
            Err(r) => return Decision::Reject(r),
        };
        let rule = limit.rule;
        // As `buckets` in decide.rs: a cost no bucket can ever hold (the
        // configuration refuses one above the route's own numbers; kept so
        // that both paths answer alike whatever it lets through).
        if f64::from(policy.cost) > rule.capacity() {
            return Decision::Reject(response::too_costly(&**limit, policy.cost, rule.capacity()));
        }
        let decide = |key: &mut String| {
            let (prefix, secret) = (&self.core.prefix, self.core.key_secret.as_ref());
            let (_, id) = material.write_key(key, prefix, &limit.name, secret);
            let cost = f64::from(policy.cost);
            let (allowed, s) = memory.check_key(key, rule, false, cost);
            let outcome = outcome_of(policy, false, 0, allowed, Some(s.enough), Via::Redis);
            crate::metrics::decided(
                &policy.metrics,
                std::iter::once(&limit.name),
                std::iter::once((outcome, false)),
            );
            let refused_by = (!allowed).then_some(0);
            let items = smallvec![Item::new(&limit.name, &rule, false, cost).with(&s)];
            let mut headers = RateHeaders::new(self.header_style, items, refused_by);
            self.route_policy(policy, &[rule], policy.cost, &mut headers);
            if allowed {
                return Decision::Admit(Admitted {
                    headers: Some(headers),
                    ..Admitted::default()
                });
            }
            let retry = retry_after_secs(s.wait);
            let refusal = response::refusal(&**limit, id.of(key), headers, retry, false, false);
            Decision::Reject(refusal)
        };
        // Taken already only if a log line of this thread's decision came
        // back here (a subscriber calling the layer): then a key of its own.
        KEY.with(|key| match key.try_borrow_mut() {
            Ok(mut key) => decide(&mut key),
            Err(_) => decide(&mut String::new()),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use axum::extract::ConnectInfo;
    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};

    use super::super::{Decided, Extras, Prepared};
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
        let route = l.route(req);
        let policy = route.policy.unwrap();
        seen(match l.prepare_keys(req, route.matched, policy) {
            Prepared::Now(d) => d,
            Prepared::Ask(p) => match l.decide(p) {
                Decided::Now(d) => d,
                Decided::Later(_) => panic!("the in-process store decides at once"),
            },
            Prepared::Unlimited => panic!("the route is limited"),
        })
    }

    /// This module's answer.
    fn lone(l: &Arc<Limiter>, req: &Request<()>) -> Seen {
        let route = l.route(req);
        assert!(l.lone(route.policy.unwrap()).is_some(), "a lone route");
        match l.prepare_routed(req, &route) {
            Prepared::Now(d) => seen(d),
            _ => panic!("decided at once"),
        }
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
            let r = req(Some("a"), None);
            let route = l.route(&r);
            assert!(l.lone(route.policy.unwrap()).is_none(), "{toml}");
        }
        let two =
            format!("[limits.k]\n{base}\n[limits.j]\n{base}\n[default]\nlimits = [\"k\", \"j\"]\n");
        let l = limiter(&two);
        assert!(l
            .lone(l.route(&req(Some("a"), None)).policy.unwrap())
            .is_none());
    }
}
