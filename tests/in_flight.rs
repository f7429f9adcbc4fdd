//! Concurrency limits (`algorithm = "concurrency"`): requests of one key in
//! flight at once, capped over the fleet, each slot given back when its
//! response is over (ended, dropped, client gone) or at its `max_hold`.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use fleetlimit::{Config, RateLimitLayer};
use http_body::Frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use support::*;

/// How many requests are inside the handler now, and the most ever.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl Gauge {
    async fn inside(&self, for_: Duration) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(for_).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A body that sends a chunk every 50 ms and never ends: a response in
/// progress until the client goes away.
struct Drip(tokio::time::Interval);

impl http_body::Body for Drip {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.0.poll_tick(cx) {
            Poll::Ready(_) => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"chunk\n"))))),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Serves `app` on a loopback port of its own (with `ConnectInfo`), as one
/// instance of the fleet.
async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// One HTTP/1.1 GET over a new connection; (status, lower-cased response).
async fn get_http(addr: SocketAddr, path: &str, api_key: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\nx-api-key: {api_key}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let out = String::from_utf8_lossy(&out).to_ascii_lowercase();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, out)
}

fn header_in(raw: &str, name: &str) -> Option<String> {
    raw.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .map(|v| v.trim().to_owned())
}

/// The Redis key of limit `limit` for API key `value`.
fn redis_key(cfg: &Config, limit: &str, value: &str) -> String {
    fleetlimit::admin::Admin::redis_key(cfg, limit, value).unwrap()
}

/// `GET /` answers "ok" once `gate` gives it a permit: requests held in
/// the handler for as long as the test wants.
fn gated(gate: &Arc<Semaphore>) -> Router {
    let g = Arc::clone(gate);
    Router::new().route(
        "/",
        get(move || {
            let g = Arc::clone(&g);
            async move {
                g.acquire().await.unwrap().forget();
                "ok"
            }
        }),
    )
}

fn zcard(server: &RedisServer, key: &str) -> u64 {
    server.cli(&["ZCARD", key]).unwrap().trim().parse().unwrap()
}

/// Waits (at most 10 s, by 10 ms steps) until `n` of `tasks` are finished:
/// the refused requests, while the admitted ones wait at a gate.
async fn settled<T>(tasks: &[tokio::task::JoinHandle<T>], n: usize) -> bool {
    for _ in 0..1000 {
        if tasks.iter().filter(|t| t.is_finished()).count() >= n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Polls until `done` (every 50 ms, at most `bound`); whether it happened.
async fn eventually(bound: Duration, mut done: impl FnMut() -> bool) -> bool {
    let polls = (bound.as_millis() / 50).max(1);
    for _ in 0..polls {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done()
}

const IN_FLIGHT_5: &str = r#"
[limits.in-flight]
key = "header:x-api-key"
algorithm = "concurrency"
max_in_flight = 5
max_hold = "30s"

[default]
limits = ["in-flight"]
on_redis_error = "closed"
"#;

/// Four instances on one Redis, 100 concurrent requests of one key: never
/// more than 5 in the handler at once, the rest refused with a
/// `Retry-After`, and every slot given back afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_instances_never_more_than_max_in_flight() {
    let server = RedisServer::start();
    let prefix = prefix("in-flight-4");
    // A generous deadline: a store failure would show as a 503 (closed),
    // which the test counts as a failure.
    let cfg = redis_config(&server, &prefix, "2s", IN_FLIGHT_5);
    let key = redis_key(&cfg, "in-flight", "shared");
    let gauge = Arc::new(Gauge::default());
    let mut addrs = Vec::new();
    for _ in 0..4 {
        let g = Arc::clone(&gauge);
        let app = Router::new()
            .route(
                "/",
                get(move || {
                    let g = Arc::clone(&g);
                    async move {
                        g.inside(Duration::from_millis(200)).await;
                        "ok"
                    }
                }),
            )
            .layer(RateLimitLayer::new(cfg.clone()).await.unwrap());
        addrs.push(serve(app).await);
    }
    let tasks: Vec<_> = (0..100)
        .map(|i| tokio::spawn(get_http(addrs[i % 4], "/", "shared")))
        .collect();
    let mut admitted = 0;
    for t in tasks {
        let (status, raw) = t.await.unwrap();
        match status {
            200 => {
                admitted += 1;
                assert_eq!(header_in(&raw, "x-ratelimit-limit").as_deref(), Some("5"));
            }
            429 => {
                let retry: u64 = header_in(&raw, "retry-after").unwrap().parse().unwrap();
                assert!(retry >= 1, "{raw}");
                assert!(raw.contains("in-flight"), "the body names the limit: {raw}");
                assert_eq!(
                    header_in(&raw, "x-ratelimit-remaining").as_deref(),
                    Some("0")
                );
            }
            other => panic!("status {other}: {raw}"),
        }
    }
    let most = gauge.max.load(Ordering::SeqCst);
    assert!(most <= 5, "{most} in the handler at once");
    assert!(admitted >= 5, "only {admitted} admitted");
    assert!(admitted < 100, "all admitted: nothing was limited");
    // Released in the background when each response ended: well within
    // max_hold (30 s).
    assert!(
        eventually(Duration::from_secs(10), || server
            .cli(&["EXISTS", &key])
            .unwrap()
            .trim()
            == "0")
        .await,
        "slots still held: {:?}",
        server.cli(&["ZRANGE", &key, "0", "-1", "WITHSCORES"])
    );
    // Free again: a new request is admitted.
    assert_eq!(get_http(addrs[0], "/", "shared").await.0, 200);
}

/// An instance in a process of its own (`examples/concurrency.rs`) killed
/// with SIGKILL while its requests hold slots: the slots still count, then
/// stop counting at their `max_hold`, and the key expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_killed_holding_slots_frees_them_after_max_hold() {
    use std::io::BufRead;

    let server = RedisServer::start();
    let prefix = prefix("in-flight-kill");
    let toml = format!(
        r#"[redis]
url = "{url}"
key_prefix = "{prefix}"
deadline = "2s"

[limits.searches-in-flight]
key = "header:x-api-key"
algorithm = "concurrency"
max_in_flight = 2
max_hold = "2s"

[[routes]]
path = "/search"
methods = ["GET"]
limits = ["searches-in-flight"]
on_redis_error = "closed"
"#,
        url = server.url()
    );
    let dir = server.dir().join("example");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("concurrency.toml");
    std::fs::write(&path, &toml).unwrap();
    let cfg = Config::from_toml_str(&toml).unwrap();
    let key = redis_key(&cfg, "searches-in-flight", "k");

    let port = free_port();
    let mut child = std::process::Command::new(support::example::example_binary("concurrency"))
        .env("FLEETLIMIT_ADDR", format!("127.0.0.1:{port}"))
        .env("FLEETLIMIT_CONFIG", &path)
        .env("REDIS_URL", server.url())
        .env("RUST_LOG", "off")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut banner = String::new();
    stdout.read_line(&mut banner).unwrap();
    assert!(banner.contains("using Redis"), "{banner}");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    // Two searches that would take a minute take both slots.
    let holders: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                let req = "GET /search?ms=60000 HTTP/1.1\r\nhost: x\r\nx-api-key: k\r\n\r\n";
                s.write_all(req.as_bytes()).await.unwrap();
                let mut out = Vec::new();
                let _ = s.read_to_end(&mut out).await;
                out
            })
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(10), || zcard(&server, &key) == 2).await,
        "the two searches did not take their slots"
    );
    // The slots' key expires with its last slot's deadline, no later.
    let pttl: i64 = server.cli(&["PTTL", &key]).unwrap().trim().parse().unwrap();
    assert!(pttl > 0 && pttl <= 2001, "PTTL {pttl}");

    child.kill().unwrap(); // SIGKILL: no chance to give anything back
    child.wait().unwrap();
    for h in holders {
        let _ = h.await; // their connections were cut
    }
    // Another instance, on the same Redis.
    let other = serve(
        Router::new()
            .route("/search", get(|| async { "ok" }))
            .layer(RateLimitLayer::new(cfg.clone()).await.unwrap()),
    )
    .await;
    // Taken under 2 s ago at most: still counted until their deadline, so
    // this is refused, unless the machine was so slow that they already
    // passed it (then the next check sees the key gone, which is fine).
    let (status, raw) = get_http(other, "/search", "k").await;
    if status == 429 {
        assert!(raw.contains("searches-in-flight"), "{raw}");
    } else {
        assert_eq!(status, 200, "{raw}");
    }
    // After max_hold (2 s) the dead instance's slots no longer count: a
    // request is admitted, and once it is over the key is gone (expired or
    // emptied). Bounded at 5 × max_hold.
    let mut admitted = false;
    for _ in 0..100 {
        if get_http(other, "/search", "k").await.0 == 200 {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(admitted, "the dead instance's slots never stopped counting");
    assert!(
        eventually(Duration::from_secs(10), || server
            .cli(&["EXISTS", &key])
            .unwrap()
            .trim()
            == "0")
        .await,
        "the key outlived its slots: PTTL {:?}",
        server.cli(&["PTTL", &key])
    );
}

/// A client that goes away mid-response gives its slot back (the response
/// body is dropped), long before `max_hold`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_response_frees_its_slot() {
    let server = RedisServer::start();
    let prefix = prefix("in-flight-gone");
    let body = IN_FLIGHT_5.replace("max_in_flight = 5", "max_in_flight = 1");
    let cfg = redis_config(&server, &prefix, "2s", &body);
    let key = redis_key(&cfg, "in-flight", "k");
    let app = Router::new()
        .route(
            "/",
            get(|| async { Body::new(Drip(tokio::time::interval(Duration::from_millis(50)))) }),
        )
        .layer(RateLimitLayer::new(cfg).await.unwrap());
    let addr = serve(app).await;

    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nx-api-key: k\r\n\r\n")
        .await
        .unwrap();
    // Read until the first chunk of the body has arrived.
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("chunk") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    assert_eq!(zcard(&server, &key), 1);
    // The only slot is taken: another request of the key is refused.
    assert_eq!(get_http(addr, "/", "k").await.0, 429);
    drop(s);
    // max_hold is 30 s: given back within 10 s means released, not expired.
    assert!(
        eventually(Duration::from_secs(10), || zcard(&server, &key) == 0).await,
        "the slot of a client that went away is still held"
    );
}

/// A request cancelled while Redis is asked (an outer timeout, a reset
/// stream): the script still runs once Redis answers, and the slot it took
/// is given back then, not held until max_hold (30 s). One connection, so
/// the release reaches Redis after the script it undoes.
#[tokio::test]
async fn a_request_cancelled_while_redis_is_asked_gives_its_slot_back() {
    let server = RedisServer::start();
    let prefix = prefix("in-flight-cancelled");
    let src = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\ndeadline = \"3s\"\npool_size = 1\n{IN_FLIGHT_5}",
        server.url()
    );
    let cfg = Config::from_toml_str(&src).unwrap();
    let key = redis_key(&cfg, "in-flight", "k");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(cfg).await.unwrap());
    let call = || {
        send(
            &app,
            request("GET", "/", "192.0.2.1:1", &[("x-api-key", "k")]),
        )
    };
    // Loads the script; its slot is given back when the body is dropped.
    assert_eq!(call().await.status(), 200);
    assert!(eventually(Duration::from_secs(5), || zcard(&server, &key) == 0).await);
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();

    server.freeze();
    let cut = tokio::time::timeout(Duration::from_millis(300), call()).await;
    assert!(cut.is_err(), "answered while Redis was frozen");
    server.thaw();
    assert!(
        eventually(Duration::from_secs(5), || server.calls_of("evalsha") == 1
            && server.calls_of("zrem") == 1)
        .await,
        "the cancelled request's script and its release did not both reach Redis"
    );
    assert_eq!(
        zcard(&server, &key),
        0,
        "the cancelled request's slot is held"
    );
}

/// A route counted against a token bucket and a concurrency limit: all or
/// nothing. A refusal by either charges neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_with_a_token_bucket_all_or_nothing() {
    let server = RedisServer::start();
    let prefix = prefix("in-flight-mixed");
    let body = r#"
[limits.per-key]
key = "header:x-api-key"
capacity = 2
refill = "1/d"

[limits.in-flight]
key = "header:x-api-key"
algorithm = "concurrency"
max_in_flight = 1
max_hold = "30s"

[default]
limits = ["per-key", "in-flight"]
on_redis_error = "closed"
"#;
    let cfg = redis_config(&server, &prefix, "2s", body);
    let slots = redis_key(&cfg, "in-flight", "k");
    let admin = fleetlimit::admin::Admin::connect(&cfg).await.unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let app = gated(&gate).layer(RateLimitLayer::new(cfg).await.unwrap());
    let req = || request("GET", "/", "127.0.0.1:9", &[("x-api-key", "k")]);

    // A takes a token and the slot, and waits in the handler.
    let a = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, req()).await })
    };
    assert!(eventually(Duration::from_secs(10), || zcard(&server, &slots) == 1).await);
    // `fleetlimit inspect` reads the set of slots.
    let seen = admin.inspect("k", Some("in-flight")).await.unwrap();
    assert!(
        seen[0].state().starts_with("1 of 1 slots in flight"),
        "{seen:?}"
    );
    assert!(seen[0].pttl() > 0 && seen[0].pttl() <= 30_001, "{seen:?}");
    // B: refused by the concurrency limit; its token is not taken.
    let b = send(&app, req()).await;
    assert_eq!(b.status(), 429);
    assert!(body_text(b).await.contains("in-flight"));
    gate.add_permits(1);
    let a = a.await.unwrap();
    assert_eq!(a.status(), 200);
    drop(a); // the response is over: the slot goes back
    assert!(eventually(Duration::from_secs(10), || zcard(&server, &slots) == 0).await);
    // C: the token B did not take is still there.
    gate.add_permits(1);
    let c = send(&app, req()).await;
    assert_eq!(c.status(), 200, "B's refusal took a token");
    drop(c);
    assert!(eventually(Duration::from_secs(10), || zcard(&server, &slots) == 0).await);
    // D: refused by the token bucket (empty); it takes no slot.
    let d = send(&app, req()).await;
    assert_eq!(d.status(), 429);
    assert!(body_text(d).await.contains("per-key"));
    assert_eq!(zcard(&server, &slots), 0, "a refused request took a slot");
    server.assert_every_key_expires(&prefix);
}

/// The in-process store (no Redis): the same cap, slots given back when the
/// response is over, and a slot never given back stops counting at its
/// `max_hold` (on tokio's paused clock).
#[tokio::test(start_paused = true)]
async fn in_process_store_caps_and_frees_slots() {
    let cfg = Config::from_toml_str(
        r#"
[limits.in-flight]
key = "header:x-api-key"
algorithm = "concurrency"
max_in_flight = 3
max_hold = "10s"

[default]
limits = ["in-flight"]
cost = 7
"#,
    )
    .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let app = gated(&gate)
        .route(
            "/stream",
            get(|| async { Body::new(Drip(tokio::time::interval(Duration::from_secs(1)))) }),
        )
        .layer(RateLimitLayer::new(cfg).await.unwrap());
    let req = |path: &str| request("GET", path, "127.0.0.1:9", &[("x-api-key", "k")]);
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let app = app.clone();
            let r = req("/");
            tokio::spawn(async move { send(&app, r).await.status().as_u16() })
        })
        .collect();
    // The refused ones answer at once; the admitted ones wait at the gate.
    assert!(settled(&tasks, 7).await);
    gate.add_permits(3);
    let mut statuses: Vec<u16> = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429, 429, 429, 429]);
    // All three given back: three more fit, then a fourth does not.
    let held: Vec<_> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            let r = send(&app, req("/stream")).await;
            assert_eq!(r.status(), 200);
            v.push(r);
        }
        v
    };
    let refused = send(&app, req("/stream")).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(header(&refused, "retry-after").as_deref(), Some("1"));
    // Never ended nor dropped: they count until max_hold (10 s), no longer.
    tokio::time::advance(Duration::from_secs(9)).await;
    assert_eq!(send(&app, req("/")).await.status(), 429);
    tokio::time::advance(Duration::from_millis(1_001)).await;
    gate.add_permits(1);
    assert_eq!(send(&app, req("/")).await.status(), 200);
    drop(held);
}

/// Redis down, `local`, a fleet of 2: max_in_flight 4 → 2 on this instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_local_gives_this_instance_its_share() {
    let server = RedisServer::start();
    let prefix = prefix("in-flight-local");
    let body = r#"
[fleet]
size = 2

[limits.in-flight]
key = "header:x-api-key"
algorithm = "concurrency"
max_in_flight = 4
max_hold = "30s"

[default]
limits = ["in-flight"]
on_redis_error = "local"
"#;
    let cfg = redis_config(&server, &prefix, "50ms", body);
    let gate = Arc::new(Semaphore::new(0));
    let app = gated(&gate).layer(RateLimitLayer::new(cfg).await.unwrap());
    server.kill();
    let req = || request("GET", "/", "127.0.0.1:9", &[("x-api-key", "k")]);
    for round in 0..2 {
        let tasks: Vec<_> = (0..5)
            .map(|_| {
                let app = app.clone();
                tokio::spawn(async move { send(&app, req()).await })
            })
            .collect();
        // Refusals answer at once: wait for the three before opening the gate.
        assert!(settled(&tasks, 3).await, "round {round}");
        gate.add_permits(2);
        let mut statuses = Vec::new();
        for t in tasks {
            let r = t.await.unwrap();
            if r.status() == 429 {
                // The fleet's policy; no remaining claimed from this
                // instance's share (docs/algorithms.md, "Degraded mode").
                assert_eq!(header(&r, "x-ratelimit-limit").as_deref(), Some("4"));
                assert_eq!(header(&r, "x-ratelimit-remaining"), None);
            }
            statuses.push(r.status().as_u16());
        }
        statuses.sort_unstable();
        assert_eq!(statuses, [200, 200, 429, 429, 429], "round {round}");
    }
}

/// Garbage in one key's place (another type, a deadline far beyond
/// max_hold, no expiry) is that key's problem only, and repaired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_a_key_affects_that_key_only() {
    let server = RedisServer::start();
    let prefix = prefix("in-flight-garbage");
    let body = IN_FLIGHT_5.replace("max_in_flight = 5", "max_in_flight = 1");
    let cfg = redis_config(&server, &prefix, "2s", &body);
    let (a, b, c) = (
        redis_key(&cfg, "in-flight", "a"),
        redis_key(&cfg, "in-flight", "b"),
        redis_key(&cfg, "in-flight", "c"),
    );
    server.cli(&["SET", &a, "not a set of slots"]).unwrap();
    // A slot whose deadline is ~30 years away, in a set without expiry.
    server
        .cli(&["ZADD", &b, "2000000000000000", "forever"])
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let app = gated(&gate).layer(RateLimitLayer::new(cfg).await.unwrap());
    let req = |k: &str| request("GET", "/", "127.0.0.1:9", &[("x-api-key", k)]);
    for (k, key) in [("a", &a), ("b", &b), ("c", &c)] {
        let app2 = app.clone();
        let r = req(k);
        let t = tokio::spawn(async move { send(&app2, r).await.status() });
        // The garbage counted as nothing: this request holds the one slot.
        assert!(
            eventually(Duration::from_secs(10), || server
                .cli(&["TYPE", key])
                .unwrap()
                .trim()
                == "zset"
                && zcard(&server, key) == 1)
            .await,
            "key {k}"
        );
        let pttl: i64 = server.cli(&["PTTL", key]).unwrap().trim().parse().unwrap();
        assert!(pttl > 0 && pttl <= 30_001, "key {k}: PTTL {pttl}");
        // ... and the cap holds on it.
        assert_eq!(send(&app, req(k)).await.status(), 429, "key {k}");
        gate.add_permits(1);
        assert_eq!(t.await.unwrap(), 200, "key {k}");
    }
    // Every slot given back: nothing left of the three keys.
    assert!(
        eventually(Duration::from_secs(10), || server
            .keys_with_pttl(&prefix)
            .is_empty())
        .await,
        "{:?}",
        server.keys_with_pttl(&prefix)
    );
}

/// Bad concurrency settings fail at start with `file:line:col`.
#[test]
fn config_errors_say_where() {
    let good = r#"[limits.in-flight]
key = "header:x-api-key"
algorithm = "concurrency"
max_in_flight = 5
max_hold = "30s"

[default]
limits = ["in-flight"]
"#;
    let dir = std::env::temp_dir().join(format!("fleetlimit-in-flight-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let error_for = |name: &str, from: &str, to: &str| {
        assert!(good.contains(from), "{from}");
        let path = dir.join(name);
        std::fs::write(&path, good.replace(from, to)).unwrap();
        let e = Config::from_toml_file(&path).unwrap_err().to_string();
        e.replace(&path.display().to_string(), name)
    };
    assert!(Config::from_toml_str(good).is_ok());
    // Defaults: max_hold may be left out (60 s).
    assert!(Config::from_toml_str(&good.replace("max_hold = \"30s\"\n", "")).is_ok());
    let e = error_for("cap.toml", "max_in_flight = 5", "capacity = 5");
    assert!(
        e.starts_with(
            "cap.toml:4:12: limit \"in-flight\": `capacity` does not apply to a concurrency limit"
        ),
        "{e}"
    );
    let e = error_for("win.toml", "max_hold = \"30s\"", "window = \"1s\"");
    assert!(e.starts_with("win.toml:5:10:"), "{e}");
    assert!(
        e.contains("`window` does not apply to a concurrency limit"),
        "{e}"
    );
    let e = error_for("zero.toml", "max_in_flight = 5", "max_in_flight = 0");
    assert!(
        e.starts_with("zero.toml:4:17: limit \"in-flight\": max_in_flight must be at least 1"),
        "{e}"
    );
    let e = error_for("missing.toml", "max_in_flight = 5\n", "");
    assert!(e.contains("missing `max_in_flight`"), "{e}");
    assert!(e.starts_with("missing.toml:1:"), "{e}");
    let e = error_for("hold.toml", "max_hold = \"30s\"", "max_hold = \"0s\"");
    assert!(e.starts_with("hold.toml:5:12:"), "{e}");
    assert!(
        e.contains("max_hold must be a whole number of milliseconds"),
        "{e}"
    );
    let e = error_for("long.toml", "max_hold = \"30s\"", "max_hold = \"2d\"");
    assert!(e.starts_with("long.toml:5:12:"), "{e}");
    assert!(e.contains("max_hold must be at most 24 h"), "{e}");
    // Past max_in_flight nothing is taken: a concurrency limit only refuses.
    let e = error_for(
        "escalate.toml",
        "max_hold = \"30s\"",
        "max_hold = \"30s\"\non_exceed = \"challenge\"",
    );
    assert!(e.starts_with("escalate.toml:6:13:"), "{e}");
    assert!(e.contains("a concurrency limit can only refuse"), "{e}");
    // A delayed request would hold its slot while it waits.
    let e = error_for(
        "delay.toml",
        "[default]\nlimits = [\"in-flight\"]",
        "[limits.slow]\nkey = \"ip\"\ncapacity = 5\nrefill = \"1/s\"\non_exceed = \"delay\"\n\
         delay = \"1s\"\n\n[default]\nlimits = [\"in-flight\", \"slow\"]",
    );
    assert!(e.starts_with("delay.toml:15:24:"), "{e}");
    assert!(
        e.contains("cannot have both a concurrency limit and a limit that delays"),
        "{e}"
    );
    // A bucket's table with a concurrency field.
    let e = error_for(
        "tb.toml",
        "algorithm = \"concurrency\"\nmax_in_flight = 5\nmax_hold = \"30s\"",
        "capacity = 5\nrefill = \"1/s\"\nmax_in_flight = 5",
    );
    assert!(
        e.starts_with(
            "tb.toml:5:17: limit \"in-flight\": `max_in_flight` does not apply to a token bucket"
        ),
        "{e}"
    );
    // A plan may change max_in_flight; a route's cost is no concern of it.
    let plans = format!(
        "{}\n[plans.pro.in-flight]\nmax_in_flight = 20\n",
        good.replace(
            "limits = [\"in-flight\"]",
            "limits = [\"in-flight\"]\ncost = 9"
        )
    );
    assert!(
        Config::from_toml_str(&plans).is_ok(),
        "{:?}",
        Config::from_toml_str(&plans).err()
    );
}

/// On a cluster, limits in different hash slots are decided one call per
/// slot: a slot taken by the first call is given back when a later call
/// refuses (no negative cost can do that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_later_refusal_gives_the_slot_back() {
    let cluster = RedisCluster::start();
    let prefix = prefix("in-flight-cluster");
    let body = r#"
[limits.in-flight]
key = "header:x-api-key"
algorithm = "concurrency"
max_in_flight = 5
max_hold = "30s"

[limits.everyone]
key = "global"
capacity = 1
refill = "1/d"

[default]
limits = ["in-flight", "everyone"]
on_redis_error = "closed"
"#;
    let cfg = cluster_config(&cluster, &prefix, "2s", body);
    let key = redis_key(&cfg, "in-flight", "k");
    let app = ok_app(cfg).await;
    let held = || {
        cluster
            .keys_with_pttl(&prefix)
            .iter()
            .any(|(k, _)| *k == key)
    };
    let req = || request("GET", "/", "127.0.0.1:9", &[("x-api-key", "k")]);
    let first = send(&app, req()).await;
    assert_eq!(first.status(), 200);
    assert!(held());
    drop(first);
    assert!(eventually(Duration::from_secs(10), || !held()).await);
    // The slot's call admits, the global bucket's refuses: the slot goes
    // back (max_hold is 30 s: within 10 s means given back).
    let second = send(&app, req()).await;
    assert_eq!(second.status(), 429);
    assert!(body_text(second).await.contains("everyone"));
    assert!(
        eventually(Duration::from_secs(10), || !held()).await,
        "the slot taken before the refusal is still held"
    );
    cluster.assert_every_key_expires(&prefix);
}

/// Redis frozen (SIGSTOP): checks time out, `local` decides with this
/// instance's slots; the slots a timed-out script may still take once Redis
/// runs again stop counting at max_hold (2 s here), and the key expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_frozen_local_decides_and_nothing_outlives_max_hold() {
    let server = RedisServer::start();
    let prefix = prefix("in-flight-frozen");
    let body = r#"
[fleet]
size = 1

[limits.in-flight]
key = "header:x-api-key"
algorithm = "concurrency"
max_in_flight = 2
max_hold = "2s"

[default]
limits = ["in-flight"]
on_redis_error = "local"
"#;
    let cfg = redis_config(&server, &prefix, "100ms", body);
    let key = redis_key(&cfg, "in-flight", "k");
    let gate = Arc::new(Semaphore::new(0));
    let app = gated(&gate).layer(RateLimitLayer::new(cfg).await.unwrap());
    let req = || request("GET", "/", "127.0.0.1:9", &[("x-api-key", "k")]);
    server.freeze();
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, req()).await.status().as_u16() })
        })
        .collect();
    // The refusal answers once its check timed out; the two admitted wait.
    assert!(settled(&tasks, 1).await);
    gate.add_permits(2);
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 429]);
    server.thaw();
    // Whatever the frozen calls did once Redis ran them, nothing counts
    // past max_hold: bounded at 5 × max_hold.
    assert!(
        eventually(Duration::from_secs(10), || server
            .cli(&["EXISTS", &key])
            .unwrap()
            .trim()
            == "0")
        .await,
        "{:?}",
        server.cli(&["ZRANGE", &key, "0", "-1", "WITHSCORES"])
    );
    gate.add_permits(1);
    let mut admitted = false;
    for _ in 0..100 {
        if send(&app, req()).await.status() == 200 {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(admitted, "never admitted again after the thaw");
}
