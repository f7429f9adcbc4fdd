//! fleetlimit::client: the waits, retries and pacing against a scripted
//! server (paused time), then against the quickstart example on Redis.
// Its Redis tests need the `redis` feature; their helpers are unused without it.
#![cfg_attr(not(feature = "redis"), allow(dead_code, unused_imports))]

use crate::support;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io::BufRead;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetlimit::client::HonorLimitsLayer;
use http::{Method, Request, Response, StatusCode};
use tokio::time::Instant;
use tower::{BoxError, Layer, Service, ServiceExt, service_fn};

/// One request the scripted server saw: when, what.
#[derive(Debug, Clone)]
struct Seen {
    at: Instant,
    method: Method,
    uri: String,
    body: String,
}

/// A scripted answer: status and headers.
type Answer = (u16, Vec<(&'static str, String)>);

/// A server that answers from a script (then 200s), logging each request.
#[derive(Clone, Default)]
struct Script {
    answers: Arc<Mutex<VecDeque<Answer>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Script {
    fn then(self, status: u16, headers: &[(&'static str, &str)]) -> Self {
        let h = headers.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        self.answers.lock().unwrap().push_back((status, h));
        self
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn service(
        &self,
    ) -> impl Service<
        Request<String>,
        Response = Response<String>,
        Error = Infallible,
        Future = impl Send + use<>,
    >
    + Clone
    + Send
    + 'static
    + use<> {
        let this = self.clone();
        service_fn(move |req: Request<String>| {
            this.seen.lock().unwrap().push(Seen {
                at: Instant::now(),
                method: req.method().clone(),
                uri: req.uri().to_string(),
                body: req.body().clone(),
            });
            let (status, headers) = this
                .answers
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or((200, Vec::new()));
            let mut res = Response::new(format!("answer {status}"));
            *res.status_mut() = StatusCode::from_u16(status).unwrap();
            for (k, v) in headers {
                res.headers_mut().append(k, v.parse().unwrap());
            }
            async move { Ok::<_, Infallible>(res) }
        })
    }
}

fn get(uri: &str) -> Request<String> {
    Request::get(uri).body(String::new()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_waited_out_within_the_jitter_bounds() {
    let mut waits = Vec::new();
    for _ in 0..100 {
        let script = Script::default().then(429, &[("retry-after", "10")]);
        let client = HonorLimitsLayer::new().jitter(0.5).layer(script.service());
        let start = Instant::now();
        let res = client.oneshot(get("/a")).await.unwrap();
        assert_eq!(res.status(), 200);
        let seen = script.seen();
        assert_eq!(seen.len(), 2);
        let wait = seen[1].at - seen[0].at;
        assert!(
            (Duration::from_secs(10)..=Duration::from_secs(15)).contains(&wait),
            "{wait:?}"
        );
        assert_eq!(start.elapsed(), wait, "answered as soon as the retry was");
        waits.push(wait);
    }
    // Spread over the range, not one fixed wait: with 100 uniform picks in
    // 10..=15 s, neither fifth stays empty (each 0.8^100 ≈ 2e-10).
    assert!(
        waits.iter().any(|w| *w < Duration::from_secs(11)),
        "{waits:?}"
    );
    assert!(
        waits.iter().any(|w| *w > Duration::from_secs(14)),
        "{waits:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn no_jitter_means_the_exact_wait_and_503_is_waited_out_too() {
    let script = Script::default()
        .then(503, &[("retry-after", "3")])
        .then(429, &[("ratelimit", r#""default";r=0;t=4"#)])
        .then(429, &[]);
    let client = HonorLimitsLayer::new()
        .jitter(0.0)
        .default_wait(Duration::from_secs(2))
        .layer(script.service());
    let res = client.oneshot(get("/a")).await.unwrap();
    assert_eq!(res.status(), 200);
    let at: Vec<_> = script.seen().iter().map(|s| s.at).collect();
    assert_eq!(at.len(), 4);
    assert_eq!(at[1] - at[0], Duration::from_secs(3), "Retry-After");
    assert_eq!(at[2] - at[1], Duration::from_secs(4), "the draft field's t");
    assert_eq!(at[3] - at[2], Duration::from_secs(2), "no advice: default");
}

#[tokio::test(start_paused = true)]
async fn a_wait_beyond_max_wait_returns_the_refusal_at_once() {
    let script = Script::default().then(
        429,
        &[("retry-after", "60"), ("x-ratelimit-remaining", "0")],
    );
    let client = HonorLimitsLayer::new()
        .max_wait(Duration::from_secs(30))
        .layer(script.service());
    let start = Instant::now();
    let res = client.oneshot(get("/a")).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(res.status(), 429);
    assert_eq!(res.headers()["retry-after"], "60");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
    assert_eq!(res.body(), "answer 429");
    assert_eq!(script.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_exhausted_budget_returns_the_refusal_unchanged() {
    // One retry in the budget, no refill.
    let script = Script::default()
        .then(429, &[("retry-after", "1")])
        .then(200, &[])
        .then(
            429,
            &[
                ("retry-after", "1"),
                ("x-ratelimit-limit", "5"),
                ("x-custom", "kept"),
            ],
        );
    let mut client = HonorLimitsLayer::new()
        .retry_budget(1, 0.0, 0.0)
        .layer(script.service());
    let res = client.ready().await.unwrap().call(get("/a")).await.unwrap();
    assert_eq!(res.status(), 200, "the budget paid for one retry");
    assert_eq!(script.seen().len(), 2);

    let start = Instant::now();
    let res = client.ready().await.unwrap().call(get("/a")).await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "no wait for a retry not made"
    );
    let h = res.headers();
    assert_eq!(
        (&h["retry-after"], &h["x-ratelimit-limit"], &h["x-custom"]),
        (
            &"1".parse::<http::HeaderValue>().unwrap(),
            &"5".parse::<http::HeaderValue>().unwrap(),
            &"kept".parse::<http::HeaderValue>().unwrap()
        )
    );
    assert_eq!(h.len(), 3);
    assert_eq!(res.body(), "answer 429");
    assert_eq!(script.seen().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn the_budget_refills_by_requests_and_by_time() {
    // Full at 1; each request adds 0.5; nothing by time.
    let script = Script::default();
    let refuse = || {
        let _ = script.clone().then(429, &[("retry-after", "1")]);
    };
    let mut client = HonorLimitsLayer::new()
        .retry_budget(1, 0.0, 0.5)
        .layer(script.service());
    let mut sends = Vec::new();
    for _ in 0..3 {
        refuse();
        let before = script.seen().len();
        let res = client.ready().await.unwrap().call(get("/b")).await.unwrap();
        sends.push((res.status().as_u16(), script.seen().len() - before));
    }
    // 1 → retry (0) → +0.5, refused → +0.5 = 1 → retry.
    assert_eq!(sends, [(200, 2), (429, 1), (200, 2)]);

    // Refilled by time only: 1 a second.
    let script = Script::default();
    let mut client = HonorLimitsLayer::new()
        .retry_budget(1, 1.0, 0.0)
        .layer(script.service());
    for expect in [(200, 2), (429, 1)] {
        let _ = script.clone().then(429, &[("retry-after", "0")]);
        let before = script.seen().len();
        let res = client.ready().await.unwrap().call(get("/c")).await.unwrap();
        assert_eq!(
            (res.status().as_u16(), script.seen().len() - before),
            expect
        );
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    let _ = script.clone().then(429, &[("retry-after", "0")]);
    let res = client.ready().await.unwrap().call(get("/c")).await.unwrap();
    assert_eq!(res.status(), 200, "a second later, one retry again");
}

#[tokio::test(start_paused = true)]
async fn retries_stop_at_max_retries() {
    let script = Script::default();
    for _ in 0..10 {
        let _ = script.clone().then(429, &[("retry-after", "1")]);
    }
    let client = HonorLimitsLayer::new()
        .max_retries(2)
        .layer(script.service());
    let res = client.oneshot(get("/a")).await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(script.seen().len(), 3, "the request and two retries");
}

#[tokio::test(start_paused = true)]
async fn only_requests_safe_to_repeat_are_retried() {
    let script = Script::default()
        .then(429, &[("retry-after", "1")])
        .then(429, &[("retry-after", "1")]);
    let mut client = HonorLimitsLayer::new().layer(script.service());
    let post = Request::post("/orders").body("{}".to_owned()).unwrap();
    let res = client.ready().await.unwrap().call(post).await.unwrap();
    assert_eq!(res.status(), 429, "a POST is never sent twice");
    assert_eq!(script.seen().len(), 1);

    // With an Idempotency-Key it may be, and the body goes again.
    tokio::time::advance(Duration::from_secs(2)).await;
    let post = Request::post("/orders")
        .header("idempotency-key", "k1")
        .body("{\"n\":1}".to_owned())
        .unwrap();
    let res = client.ready().await.unwrap().call(post).await.unwrap();
    assert_eq!(res.status(), 200);
    let seen = script.seen();
    assert_eq!(seen.len(), 3);
    assert!(
        seen[1..]
            .iter()
            .all(|s| s.method == Method::POST && s.body == "{\"n\":1}")
    );
    for m in [Method::PUT, Method::DELETE, Method::HEAD] {
        let script = Script::default().then(429, &[("retry-after", "1")]);
        let client = HonorLimitsLayer::new().layer(script.service());
        let req = Request::builder()
            .method(m.clone())
            .uri("/x")
            .body(String::new())
            .unwrap();
        assert_eq!(client.oneshot(req).await.unwrap().status(), 200, "{m}");
        assert_eq!(script.seen().len(), 2, "{m}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_spent_quota_paces_the_next_request_to_that_origin() {
    let script = Script::default()
        .then(
            200,
            &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "3")],
        )
        .then(200, &[("ratelimit", r#""a";r=5;t=9, "b";r=0;t=5"#)]);
    let mut client = HonorLimitsLayer::new().jitter(0.0).layer(script.service());
    let start = Instant::now();
    let svc = client.ready().await.unwrap();
    assert_eq!(
        svc.call(get("http://a.test/1")).await.unwrap().status(),
        200
    );
    // Another origin is not held.
    let svc = client.ready().await.unwrap();
    assert_eq!(
        svc.call(get("http://b.test/1")).await.unwrap().status(),
        200
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    // b.test said quota "b" is spent for 5 s; a.test, 3 s.
    let (ra, rb) = tokio::join!(
        client.clone().oneshot(get("http://a.test/2")),
        client.clone().oneshot(get("http://b.test/2")),
    );
    assert_eq!(
        (ra.unwrap().status(), rb.unwrap().status()),
        (StatusCode::OK, StatusCode::OK)
    );
    let seen = script.seen();
    let sent_at = |uri: &str| seen.iter().find(|s| s.uri == uri).unwrap().at - start;
    assert_eq!(sent_at("http://a.test/2"), Duration::from_secs(3));
    assert_eq!(sent_at("http://b.test/2"), Duration::from_secs(5));
    assert_eq!(seen.len(), 4, "no round trip spent on a refusal");

    // A pause longer than max_wait is not waited: the request goes out.
    let script = Script::default().then(
        200,
        &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "100")],
    );
    let mut client = HonorLimitsLayer::new()
        .max_wait(Duration::from_secs(10))
        .layer(script.service());
    let start = Instant::now();
    for _ in 0..2 {
        let svc = client.ready().await.unwrap();
        assert_eq!(svc.call(get("/x")).await.unwrap().status(), 200);
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(script.seen().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn malformed_headers_are_ignored() {
    let script = Script::default()
        .then(
            429,
            &[
                ("retry-after", "soon"),
                ("ratelimit", r#""x";r=zero;t=-1"#),
                ("x-ratelimit-remaining", "none"),
                ("x-ratelimit-reset", "9"),
            ],
        )
        .then(
            200,
            &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "x")],
        );
    let client = HonorLimitsLayer::new()
        .jitter(0.0)
        .default_wait(Duration::from_millis(700))
        .layer(script.service());
    let start = Instant::now();
    assert_eq!(
        client.clone().oneshot(get("/m")).await.unwrap().status(),
        200
    );
    assert_eq!(start.elapsed(), Duration::from_millis(700), "default wait");
    // An unreadable reset paces nothing.
    assert_eq!(client.oneshot(get("/m")).await.unwrap().status(), 200);
    assert_eq!(start.elapsed(), Duration::from_millis(700));
}

#[tokio::test(start_paused = true)]
async fn errors_of_the_inner_client_pass_through_untried() {
    let calls = Arc::new(Mutex::new(0));
    let counted = Arc::clone(&calls);
    let failing = service_fn(move |_req: Request<String>| {
        *counted.lock().unwrap() += 1;
        async { Err::<Response<String>, _>("connection refused") }
    });
    let client = HonorLimitsLayer::new().layer(failing);
    let err = client.oneshot(get("/e")).await.unwrap_err();
    assert_eq!(err, "connection refused");
    assert_eq!(*calls.lock().unwrap(), 1);
}

#[tokio::test(start_paused = true)]
async fn huge_advised_waits_do_not_overflow() {
    let script = Script::default()
        .then(429, &[("retry-after", &u64::MAX.to_string())])
        .then(
            200,
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "999999999"),
            ],
        );
    let mut client = HonorLimitsLayer::new()
        .max_wait(Duration::MAX)
        .max_retries(0)
        .layer(script.service());
    let start = Instant::now();
    let res = client.ready().await.unwrap().call(get("/h")).await.unwrap();
    assert_eq!(res.status(), 429, "no retries allowed");
    let svc = client.ready().await.unwrap();
    assert_eq!(svc.call(get("/h")).await.unwrap().status(), 200);
    assert_eq!(start.elapsed(), Duration::ZERO);
    let svc = client.ready().await.unwrap();
    let res = tokio::time::timeout(Duration::from_secs(60), svc.call(get("/h"))).await;
    assert!(
        res.is_err(),
        "paced for the advised (31 years) wait, without a panic"
    );
    assert_eq!(script.seen().len(), 2);
}

// ---- Against the quickstart example on Redis, over real HTTP ----

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

const LIMIT: usize = 5;
const WINDOW_SECS: u64 = 1;
const WORKERS: usize = 3;

/// The quickstart server with a fixed window of `LIMIT` per `WINDOW_SECS`
/// on `/` (its own config file; the quickstart reads the path from
/// `FLEETLIMIT_CONFIG`).
struct Server {
    child: std::process::Child,
    _stdout: std::io::BufReader<std::process::ChildStdout>,
    port: u16,
}

impl Server {
    fn start(redis: &support::RedisServer) -> Self {
        let cfg = redis.dir().join("client-quickstart.toml");
        std::fs::write(
            &cfg,
            format!(
                r#"
[limits.per-key]
key = "header:x-api-key"
algorithm = "fixed-window"
limit = {LIMIT}
window = "{WINDOW_SECS}s"

[[routes]]
path = "/"
methods = ["GET"]
limits = ["per-key"]
on_redis_error = "closed"
"#
            ),
        )
        .unwrap();
        let exe = std::env::current_exe().unwrap();
        let bin = exe
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("examples/quickstart");
        assert!(
            bin.exists(),
            "{}: run `cargo build --examples`",
            bin.display()
        );
        let port = support::free_port();
        let mut child = std::process::Command::new(bin)
            .env("FLEETLIMIT_ADDR", format!("127.0.0.1:{port}"))
            .env("FLEETLIMIT_CONFIG", &cfg)
            .env("REDIS_URL", redis.url())
            .env("RUST_LOG", "off")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut banner = String::new();
        stdout.read_line(&mut banner).unwrap();
        assert!(banner.contains("using Redis"), "{banner}");
        Self {
            child,
            _stdout: stdout,
            port,
        }
    }

    fn get(&self, key: &str) -> Request<Full<Bytes>> {
        Request::get(format!("http://127.0.0.1:{}/", self.port))
            .header("x-api-key", key)
            .body(Full::new(Bytes::new()))
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

type Wire = Arc<Mutex<Vec<(std::time::Instant, u16)>>>;

/// hyper-util's client, logging every request that goes on the wire and
/// the status it got: what the server saw.
fn counted_http(
    wire: Wire,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<hyper::body::Incoming>,
    Error = BoxError,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    service_fn(move |req: Request<Full<Bytes>>| {
        let http = http.clone();
        let wire = Arc::clone(&wire);
        async move {
            let res = http.request(req).await?;
            wire.lock()
                .unwrap()
                .push((std::time::Instant::now(), res.status().as_u16()));
            Ok::<_, BoxError>(res)
        }
    })
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_driving_three_times_its_limit_sees_no_refusal() {
    let redis = support::RedisServer::start();
    let server = Server::start(&redis);

    // One caller, three windows' worth back to back: the reset the server
    // names is rounded up and counted from after its answer, so a paced
    // request always lands in the next window. Not one refusal is sent.
    let wire = Wire::default();
    let client = HonorLimitsLayer::new()
        .max_wait(Duration::from_secs(5))
        .layer(counted_http(Arc::clone(&wire)));
    for i in 0..3 * LIMIT {
        let res = client.clone().oneshot(server.get("alone")).await.unwrap();
        assert_eq!(res.status(), 200, "request {i}");
    }
    let wire = wire.lock().unwrap().clone();
    assert_eq!(
        wire.len(),
        3 * LIMIT,
        "no round trip spent on a refusal: {wire:?}"
    );

    // WORKERS callers sharing one client and key, LIMIT requests each.
    let wire = Wire::default();
    let client = HonorLimitsLayer::new()
        .max_wait(Duration::from_secs(5))
        .layer(counted_http(Arc::clone(&wire)));
    let start = std::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..WORKERS {
        let client = client.clone();
        let req = server.get("shared");
        tasks.spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..LIMIT {
                let res = client.clone().oneshot(req.clone()).await.unwrap();
                statuses.push(res.status().as_u16());
            }
            statuses
        });
    }
    while let Some(done) = tasks.join_next().await {
        assert_eq!(done.unwrap(), [200; LIMIT], "no 429 reaches a caller");
    }
    let elapsed = start.elapsed();
    let mut wire = wire.lock().unwrap().clone();
    wire.sort_by_key(|(t, _)| *t);
    let admitted = wire.iter().filter(|(_, s)| *s == 200).count();
    let refused = wire.len() - admitted;
    assert_eq!(admitted, WORKERS * LIMIT);
    assert!(wire.iter().all(|(_, s)| *s == 200 || *s == 429), "{wire:?}");
    // A refusal is sent only when other workers' requests were already in
    // flight as the quota ran out: at most WORKERS - 1 per window spanned.
    let windows = elapsed.as_secs() / WINDOW_SECS + 2;
    assert!(
        refused as u64 <= windows * (WORKERS as u64 - 1),
        "{refused} refusals in {elapsed:?}: {wire:?}"
    );
    // So any stretch of one window's length (which overlaps at most two
    // of the server's windows) saw at most 2 × (LIMIT + WORKERS - 1).
    for (i, (t0, _)) in wire.iter().enumerate() {
        let within = wire[i..]
            .iter()
            .take_while(|(t, _)| t.duration_since(*t0) < Duration::from_secs(WINDOW_SECS))
            .count();
        assert!(
            within <= 2 * (LIMIT + WORKERS - 1),
            "{within} sent within a window from #{i}: {wire:?}"
        );
    }
    redis.assert_every_key_expires("rl");
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_budget_gets_the_refusal_unchanged() {
    let redis = support::RedisServer::start();
    let server = Server::start(&redis);
    let raw = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    // Spend the key's window, then read a plain refusal for comparison.
    let mut reference = None;
    for _ in 0..=LIMIT {
        let res = raw.request(server.get("spent")).await.unwrap();
        reference = Some(res);
    }
    let reference = reference.unwrap();
    assert_eq!(reference.status(), 429);

    let wire = Wire::default();
    let client = HonorLimitsLayer::new()
        .retry_budget(0, 0.0, 0.0)
        .layer(counted_http(Arc::clone(&wire)));
    let res = client.oneshot(server.get("spent")).await.unwrap();
    assert_eq!(wire.lock().unwrap().len(), 1, "sent once, not retried");
    assert_eq!(res.status(), 429);
    for name in [
        "retry-after",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "content-type",
    ] {
        assert_eq!(
            res.headers().get(name),
            reference.headers().get(name),
            "{name}"
        );
    }
    assert_eq!(res.headers().len(), reference.headers().len());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let reference = reference.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, reference);
    redis.assert_every_key_expires("rl");
}
