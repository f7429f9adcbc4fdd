//! Heap allocations per request through `RateLimitLayer`, counted by a
//! global allocator that wraps `System`.
//!
//! ```sh
//! cargo bench --bench allocs
//! ```
//!
//! Each case is an axum `Router` (route `/`, handler `"ok"`, handlers
//! turned into routes once with `with_state`, as `axum::serve` does), every
//! request sent with `oneshot` on a clone of it on a current-thread runtime,
//! carrying an `x-api-key` header; one token-bucket limit keyed by
//! `header:x-api-key`:
//!
//! - in-process store, admitted (10,000 keys cycled, a huge limit);
//! - in-process store, refused (50 keys, burst 1 refilled 1/h, each spent
//!   in the warm-up);
//! - Redis, admitted and refused, the same limits (its own `redis-server`
//!   on a free loopback port; refused requests may be answered by the
//!   refused-key cache: `script calls/req` says how many reached Redis);
//! - bare router, the baseline: the request, the routing and the response
//!   cost this much without any limiter.
//!
//! After a warm-up (every key seen, every cache filled) the counter is read
//! before and after a run of requests; every thread's allocations count
//! (fred's I/O thread included), so background work (timers, heartbeats)
//! adds a little noise to the Redis cases. A `realloc` counts as one
//! allocation of its new size. Each case is measured twice in turn.
//!
//! Only public API that has not changed in a long time is used, so this
//! file (with `benches/load/redis.rs`, the harness's redis-server it
//! borrows) can be copied into an older checkout to compare.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use fleetlimit::{Config, RateLimitLayer};
use http::header::HeaderName;
use http::{HeaderValue, Request, StatusCode};
use tower::ServiceExt;

// The load harness's own redis-server (started on a free port, killed when
// dropped) and its RESP client.
#[allow(dead_code)]
#[path = "load/redis.rs"]
mod redis;
use redis::RedisServer;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

/// `System`, counting every allocation and its size.
struct Counting;

// SAFETY: every call is forwarded unchanged to `System`; the counters are
// plain atomics that never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn count(size: usize) {
    ALLOCATIONS.fetch_add(1, Relaxed);
    BYTES.fetch_add(size as u64, Relaxed);
}

fn counters() -> (u64, u64) {
    (ALLOCATIONS.load(Relaxed), BYTES.load(Relaxed))
}

static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// Keys cycled by the admitted cases (as `benches/hot_path.rs`).
const KEYS: usize = 10_000;
/// Keys cycled by the refused cases (as the abusers of `benches/load/`).
const REFUSED_KEYS: usize = 50;
/// Requests counted per case and pass, in process and on Redis.
const MEMORY_REQUESTS: usize = 100_000;
const REDIS_REQUESTS: usize = 20_000;
/// Passes over every case, in turn.
const PASSES: usize = 2;

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("benches/allocs.rs: run it with `cargo bench --bench allocs`");
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let redis = RedisServer::start();
    let url = format!("redis://127.0.0.1:{}", redis.port);

    let admitted_keys = header_keys("key", KEYS);
    let refused_keys = header_keys("abuser", REFUSED_KEYS);
    let huge = "capacity = 1000000000\nrefill = \"1000000/s\"";
    let tight = "capacity = 1\nrefill = \"1/h\"";
    let mut cases = vec![
        Case::new("bare axum (baseline)", app(router()), &admitted_keys),
        Case::new(
            "memory, admitted",
            app(router().layer(
                rt.block_on(async { RateLimitLayer::new(config(huge, None)).await })
                    .expect("the layer"),
            )),
            &admitted_keys,
        ),
        Case::new(
            "memory, refused",
            app(router().layer(
                rt.block_on(async { RateLimitLayer::new(config(tight, None)).await })
                    .expect("the layer"),
            )),
            &refused_keys,
        )
        .refused(),
    ];
    let on_redis = |limit: &str| {
        let cfg = config(limit, Some(&url));
        let layer = rt
            .block_on(async { RateLimitLayer::new(cfg).await })
            .expect("the layer connects to Redis");
        app(router().layer(layer))
    };
    cases.push(Case::new("Redis, admitted", on_redis(huge), &admitted_keys).on_redis());
    cases.push(
        Case::new("Redis, refused", on_redis(tight), &refused_keys)
            .on_redis()
            .refused(),
    );

    for case in &mut cases {
        rt.block_on(case.warm_up());
    }
    let mut rows: Vec<Vec<PerRequest>> = vec![Vec::new(); cases.len()];
    for _ in 0..PASSES {
        for (case, row) in cases.iter_mut().zip(&mut rows) {
            if case.redis {
                redis.reset_stats();
            }
            let mut m = rt.block_on(case.measure());
            if case.redis {
                m.script_calls = Some(redis.script_stats().0 as f64 / m.requests as f64);
            }
            row.push(m);
        }
    }

    let bare = rows[0].clone();
    let mut t = String::from(
        "| case | allocations/req | bytes/req | layer − bare: allocations/req | layer − bare: bytes/req | script calls/req |\n\
         |---|--:|--:|--:|--:|--:|\n",
    );
    for (case, row) in cases.iter().zip(&rows) {
        let cell = |f: &dyn Fn(usize) -> String| (0..PASSES).map(f).collect::<Vec<_>>().join(" / ");
        let is_bare = std::ptr::eq(row, &rows[0]);
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} |",
            case.name,
            cell(&|p| format!("{:.2}", row[p].allocations)),
            cell(&|p| format!("{:.0}", row[p].bytes)),
            if is_bare {
                "—".to_owned()
            } else {
                cell(&|p| format!("{:.2}", row[p].allocations - bare[p].allocations))
            },
            if is_bare {
                "—".to_owned()
            } else {
                cell(&|p| format!("{:.0}", row[p].bytes - bare[p].bytes))
            },
            if case.redis {
                cell(&|p| format!("{:.3}", row[p].script_calls.unwrap_or(f64::NAN)))
            } else {
                "—".to_owned()
            },
        );
    }
    println!(
        "\nAllocations per request ({PASSES} passes, `a / b`; {MEMORY_REQUESTS} requests per \
         in-process case and pass, {REDIS_REQUESTS} per Redis case)\n\n{t}"
    );
}

/// One router and the keys its requests carry.
struct Case {
    name: &'static str,
    app: Router,
    keys: Vec<HeaderValue>,
    next: usize,
    expect: StatusCode,
    redis: bool,
}

#[derive(Clone, Copy, Debug)]
struct PerRequest {
    requests: usize,
    allocations: f64,
    bytes: f64,
    script_calls: Option<f64>,
}

impl Case {
    fn new(name: &'static str, app: Router, keys: &[HeaderValue]) -> Self {
        Self {
            name,
            app,
            keys: keys.to_vec(),
            next: 0,
            expect: StatusCode::OK,
            redis: false,
        }
    }

    fn refused(mut self) -> Self {
        self.expect = StatusCode::TOO_MANY_REQUESTS;
        self
    }

    fn on_redis(mut self) -> Self {
        self.redis = true;
        self
    }

    fn requests(&self) -> usize {
        if self.redis {
            REDIS_REQUESTS
        } else {
            MEMORY_REQUESTS
        }
    }

    /// Every key seen twice (a refused key spends its one token, then is
    /// refused), then as many requests again as one measurement.
    async fn warm_up(&mut self) {
        for _ in 0..2 * self.keys.len() {
            self.send().await;
        }
        for _ in 0..self.requests() {
            let status = self.send().await;
            assert_eq!(status, self.expect, "{}: after the warm-up", self.name);
        }
    }

    async fn measure(&mut self) -> PerRequest {
        let n = self.requests();
        let (a0, b0) = counters();
        for _ in 0..n {
            let status = self.send().await;
            assert_eq!(status, self.expect, "{}", self.name);
        }
        let (a1, b1) = counters();
        PerRequest {
            requests: n,
            allocations: (a1 - a0) as f64 / n as f64,
            bytes: (b1 - b0) as f64 / n as f64,
            script_calls: None,
        }
    }

    async fn send(&mut self) -> StatusCode {
        let key = &self.keys[self.next % self.keys.len()];
        self.next += 1;
        let mut req = Request::new(Body::empty());
        req.headers_mut().insert(X_API_KEY.clone(), key.clone());
        let res = self.app.clone().oneshot(req).await.expect("infallible");
        res.status()
    }
}

fn header_keys(prefix: &str, n: usize) -> Vec<HeaderValue> {
    (0..n)
        .map(|i| HeaderValue::from_str(&format!("{prefix}-{i:05}")).expect("an ASCII key"))
        .collect()
}

fn router() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

/// Handlers turned into routes once, as `axum::serve` does.
fn app(router: Router) -> Router {
    router.with_state(())
}

/// One token-bucket limit `per-key` on `header:x-api-key` for route `/`.
/// On Redis with a deadline no busy machine misses: a check answered by
/// the failure policy instead of Redis allocates less and would pass for
/// a saving.
fn config(limit: &str, redis_url: Option<&str>) -> Config {
    let redis = redis_url.map_or_else(String::new, |u| {
        format!("[redis]\nurl = \"{u}\"\ndeadline = \"1s\"\n\n")
    });
    let toml = format!(
        "{redis}[limits.per-key]\nkey = \"header:x-api-key\"\nalgorithm = \"token-bucket\"\n\
         {limit}\n\n[[routes]]\npath = \"/\"\nlimits = [\"per-key\"]\n"
    );
    Config::from_toml_str(&toml).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}
