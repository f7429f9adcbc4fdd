//! Instructions per request through the layer, counted rather than timed:
//! a loop of `oneshot` requests on an axum `Router` (route `/`, handler
//! `"ok"`), with (`layer`) or without (`bare`) `RateLimitLayer::in_memory`,
//! one token-bucket limit keyed by `header:x-api-key` so large that every
//! request is admitted, 10,000 keys cycled. Run under valgrind, the count
//! does not depend on what else the machine is doing:
//!
//! ```sh
//! cargo bench --bench instructions --no-run      # prints the binary's path
//! B=target/release/deps/instructions-<hash>
//! for mode in bare layer; do for n in 10000 30000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null $B $mode $n 2>&1 | grep Collected
//! done; done
//! ```
//!
//! (instructions at 30,000 − at 10,000) ÷ 20,000 is one request's, set-up
//! and first inserts cancelled; `layer − bare` is the layer's. Only public
//! API that has not changed in a long time is used, so this file can be
//! copied into an older checkout to compare. `cargo bench --bench
//! instructions` alone just runs the loop once.

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use fleetlimit::{Config, RateLimitLayer};
use http::Request;
use tower::ServiceExt;

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let mode = args.next().unwrap_or_else(|| "layer".into());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let cfg = Config::from_toml_str(
        "[limits.k]\nkey = \"header:x-api-key\"\ncapacity = 1000000000\nrefill = \"1000000/s\"\n\
         [default]\nlimits = [\"k\"]\n",
    )
    .expect("a valid configuration");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let mut app = Router::new().route("/", get(|| async { "ok" }));
        if mode == "layer" {
            app = app.layer(RateLimitLayer::in_memory(&cfg));
        }
        let keys: Vec<String> = (0..10_000).map(|i| format!("key-{i}")).collect();
        for i in 0..n {
            let req = Request::get("/")
                .header("x-api-key", &keys[i % keys.len()])
                .body(Body::empty())
                .expect("a request");
            let res = app.clone().oneshot(req).await.expect("a response");
            assert!(res.status().is_success(), "{}", res.status());
        }
    });
}
