//! Hot-key token leases against a real Redis: a hot key takes tokens in
//! batches and spends them locally; the fleet never admits more than the
//! limit, strands at most a batch per instance, and saves Redis calls.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use support::*;

fn limits(lease: &str) -> String {
    format!(
        r#"
[limits.hot]
key = "header:x-api-key"
capacity = 100
refill = "1/d"
{lease}

[[routes]]
path = "/"
limits = ["hot"]
on_redis_error = "closed"
"#
    )
}

/// Three instances, 300 requests for one key in turn; (admitted, calls,
/// `X-RateLimit-Remaining` of the last admitted request).
async fn run(server: &RedisServer, prefix: &str, lease: &str) -> (usize, u64, u64) {
    let mut apps = Vec::new();
    for _ in 0..3 {
        let cfg = redis_config(server, prefix, "500ms", &limits(lease));
        apps.push(ok_app(cfg).await);
    }
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    let mut admitted = 0;
    let mut last_remaining = u64::MAX;
    for i in 0..300 {
        let res = send(
            &apps[i % 3],
            request("GET", "/", "127.0.0.1:1", &[("x-api-key", "hot")]),
        )
        .await;
        let s = res.status().as_u16();
        assert!(s == 200 || s == 429, "{s}");
        if s == 200 {
            admitted += 1;
            last_remaining = header_u64(&res, "x-ratelimit-remaining");
        }
    }
    (admitted, server.script_calls(), last_remaining)
}

#[tokio::test]
async fn leases_never_over_admit_and_save_redis_calls() {
    let server = RedisServer::start();
    let (plain, plain_calls, last_remaining) = run(&server, &prefix("no-lease"), "").await;
    assert_eq!(plain, 100);
    assert_eq!(
        last_remaining, 0,
        "the 100th admitted request empties the bucket"
    );
    let prefix = prefix("lease");
    let (leased, leased_calls, _) =
        run(&server, &prefix, "lease_batch = 10\nlease_above = 5").await;
    println!(
        "without leases: {plain} admitted, {plain_calls} script calls; with leases: {leased} admitted, {leased_calls} calls"
    );
    // Never more than the limit: leased tokens are charged before they are
    // spent. At most one batch per instance can be stranded or early.
    assert!(leased <= 100, "{leased}");
    assert!(leased >= 100 - 3 * 10, "{leased}");
    assert!(
        leased_calls * 2 <= plain_calls,
        "leases save Redis calls: {leased_calls} vs {plain_calls}"
    );
    server.assert_every_key_expires(&prefix);
}

/// Three instances' hot-key limit: burst 400 refilling `refill` a second,
/// leases of 100 above 20 requests a second.
fn hot_limits(refill: u32) -> String {
    format!(
        r#"
[limits.hot]
key = "header:x-api-key"
capacity = {BURST}
refill = "{refill}/s"
lease_batch = {BATCH}
lease_above = 20

[[routes]]
path = "/"
limits = ["hot"]
on_redis_error = "closed"
"#
    )
}

const BURST: u32 = 400;
const BATCH: u32 = 100;
const INSTANCES: usize = 3;

/// Redis's clock, in seconds.
fn redis_time(server: &RedisServer) -> f64 {
    let out = server.cli(&["TIME"]).unwrap();
    let mut it = out.lines().map(|l| l.trim().parse::<f64>().unwrap());
    let (s, us) = (it.next().unwrap(), it.next().unwrap());
    s + us / 1e6
}

/// `INSTANCES` layers on one Redis drive one key at `offered` requests a
/// second (paced, in turn, concurrent) for `secs`; (requests, admitted, script calls,
/// seconds on Redis's clock from before the first request to after the
/// last).
async fn drive(
    server: &RedisServer,
    prefix: &str,
    refill: u32,
    offered: f64,
    secs: f64,
) -> (usize, usize, u64, f64) {
    let mut apps = Vec::new();
    for _ in 0..INSTANCES {
        let cfg = redis_config(server, prefix, "500ms", &hot_limits(refill));
        apps.push(ok_app(cfg).await);
    }
    let total = (offered * secs) as usize;
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    let start = redis_time(server);
    let t0 = tokio::time::Instant::now();
    // Each request in a task of its own: they overlap the lease calls, as
    // a server's connections do.
    let mut tasks = Vec::new();
    for i in 0..total {
        // Paced: request i is due at i ÷ offered; a late driver catches up.
        tokio::time::sleep_until(t0 + std::time::Duration::from_secs_f64(i as f64 / offered)).await;
        let app = apps[i % INSTANCES].clone();
        tasks.push(tokio::spawn(async move {
            let req = request("GET", "/", "127.0.0.1:1", &[("x-api-key", "hot")]);
            let res = send(&app, req).await;
            let retry = header(&res, "retry-after");
            (res.status().as_u16(), retry)
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        match t.await.unwrap() {
            (200, _) => admitted += 1,
            // Honest: never "now" for a wait; a lease's local refusal
            // waits at most LEASE_TTL (1 s), and a batch refills faster.
            (429, retry) => assert_eq!(retry.as_deref(), Some("1"), "Retry-After"),
            (s, _) => panic!("{s}"),
        }
    }
    let calls = server.script_calls();
    let elapsed = redis_time(server) - start;
    (total, admitted, calls, elapsed)
}

/// At and over the limit, leases still batch: at most one script call per
/// 10 requests, and never more admitted than the bucket allows.
async fn hot_key_at(refill: u32, times: f64, tag: &str) {
    let server = RedisServer::start();
    let prefix = prefix(tag);
    let offered = f64::from(refill) * times;
    let (total, admitted, calls, elapsed) = drive(&server, &prefix, refill, offered, 1.5).await;
    let allowed = f64::from(BURST) + f64::from(refill) * elapsed;
    println!(
        "{tag}: {total} requests at {offered}/s, {admitted} admitted (bucket allows {allowed:.0} in \
         {elapsed:.3} s), {calls} script calls"
    );
    // Charged in Redis before spent: within the bucket, on Redis's clock.
    assert!(admitted as f64 <= allowed + 1.0, "{admitted} > {allowed}");
    assert!(
        calls as usize * 10 <= total,
        "{calls} script calls for {total} requests"
    );
    // The key was at its limit: the lease path refused some.
    assert!(admitted < total, "{admitted} of {total}");
    server.assert_every_key_expires(&prefix);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_at_1_1x_its_refill_costs_a_call_per_batch() {
    hot_key_at(2_000, 1.1, "hot-1.1x").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_at_3x_its_refill_costs_a_call_per_batch() {
    hot_key_at(750, 3.0, "hot-3x").await;
}

/// A lease lives this long at most, and so does a wait for the next one
/// (`LEASE_TTL` in `src/pipeline/lease/mod.rs`).
const LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(1);
/// How long the phases after garbage last at most: two leases' lives.
const PHASE: std::time::Duration = LEASE_TTL.saturating_mul(2);
/// How long the phase after a restart lasts at most: three.
const RESTART_PHASE: std::time::Duration = LEASE_TTL.saturating_mul(3);

/// A lease held while Redis loses the key's state (garbage written over
/// it, then a restart: empty, scripts gone): every answer stays 200, 429
/// or the route's 503, and what is admitted after stays within a fresh
/// bucket plus the leases the instances already held.
#[tokio::test]
async fn leases_held_through_garbage_state_and_a_restart_stay_bounded() {
    let server = RedisServer::start();
    let prefix = prefix("lease-fault");
    let refill = 10;
    let mut apps = Vec::new();
    for _ in 0..INSTANCES {
        let cfg = redis_config(&server, &prefix, "500ms", &hot_limits(refill));
        apps.push(ok_app(cfg).await);
    }
    let key = header_key(&prefix, "hot", "hot");
    // `n` requests, `pace` ms apart, or fewer once `span` (if any) has
    // passed: a phase lasts at least `n × pace` or `span`, whichever is
    // shorter (the count alone made it last twice as long on a machine
    // whose sleeps and requests take more than `pace`).
    let run = |n: usize, pace: u64, span: Option<std::time::Duration>| {
        let apps = &apps;
        async move {
            let end = span.map(|s| std::time::Instant::now() + s);
            let mut admitted = 0;
            for i in 0..n {
                if end.is_some_and(|end| std::time::Instant::now() >= end) {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(pace)).await;
                let res = send(
                    &apps[i % INSTANCES],
                    request("GET", "/", "127.0.0.1:1", &[("x-api-key", "hot")]),
                )
                .await;
                match res.status().as_u16() {
                    200 => admitted += 1,
                    429 | 503 => {}
                    s => panic!("{s}"),
                }
            }
            admitted
        }
    };
    // Leases taken: the bucket is below a batch now, and the instances
    // hold what they leased.
    assert!(run(360, 0, None).await <= BURST as usize + 1);
    // Most one instance can spend of what it held, and a bucket that
    // starts again full, plus its refill meanwhile.
    let bound = |elapsed: f64| {
        (INSTANCES as u32 * BATCH + BURST) as f64 + f64::from(refill) * elapsed + 1.0
    };
    for garbage in [
        &["SET", &key, "not a time"][..],
        &["HSET", &key, "f", "v"][..],
    ] {
        server.cli(&["DEL", &key]).unwrap();
        server.cli(garbage).unwrap();
        let start = redis_time(&server);
        // Over more than LEASE_TTL (1 s): the instances' waits end, and
        // they lease from the bucket that starts again.
        let admitted = run(900, 2, Some(PHASE)).await;
        let elapsed = redis_time(&server) - start;
        println!("after {garbage:?}: {admitted} admitted in {elapsed:.3} s");
        assert!(admitted as f64 <= bound(elapsed), "{admitted}");
        assert!(admitted > 0, "the key is served again");
    }
    server.restart();
    let start = redis_time(&server);
    // Longer: the pool reconnects (its backoff grows to 1 s) and a
    // breaker it opened cools off (500 ms) before leases are taken again.
    let admitted = run(1_500, 2, Some(RESTART_PHASE)).await;
    let elapsed = redis_time(&server) - start;
    println!("after a restart: {admitted} admitted in {elapsed:.3} s");
    assert!(admitted as f64 <= bound(elapsed), "{admitted}");
    // Redis answers again: leases are taken from the new bucket.
    assert!(admitted > 0);
    server.assert_every_key_expires(&prefix);
}

/// `Store::lease` on both stores: as many whole requests as are free, up
/// to the batch, possibly none, and when the whole batch fits again; a key
/// that is not a bucket's state counts as a full bucket and is replaced.
#[tokio::test]
async fn a_partial_lease_takes_what_is_free_on_both_stores() {
    use fleetlimit::store::{Bucket, Check, LimitState, MemoryStore, Rule, Store};
    use std::time::Duration;

    /// `Store::lease`'s answer (units taken, the bucket after), by name.
    #[derive(Debug)]
    struct Lease {
        granted: f64,
        state: LimitState,
    }
    async fn lease(store: &dyn Store, check: &Check, step: f64) -> Lease {
        let (granted, state) = store.lease(check, step).await.unwrap();
        Lease { granted, state }
    }

    let server = RedisServer::start();
    let redis = server
        .store(Duration::from_millis(500), Duration::from_secs(2), false)
        .await;
    let memory = MemoryStore::new(100);
    // 10 tokens, 1 back every 100 s: nothing refills during the test.
    let rule = Rule::TokenBucket {
        capacity: 10.0,
        refill_per_sec: 0.01,
    };
    let check = |key: &str, cost: f64| Check {
        cost,
        buckets: vec![Bucket {
            key: key.into(),
            rule,
            shadow: false,
        }],
        slot: None,
    };
    let key = format!("{}:lease-store", prefix("store"));
    for (name, store) in [
        ("redis", &redis as &dyn Store),
        ("memory", &memory as &dyn Store),
    ] {
        // A batch of 4 requests of cost 2 on a full bucket: all of it.
        let l = lease(store, &check(&key, 8.0), 2.0).await;
        assert_eq!(l.granted, 8.0, "{name}");
        assert!((l.state.remaining - 2.0).abs() < 1e-6, "{name} {l:?}");
        // 2 left: one request's worth, short of the batch; a whole batch
        // fits again once 8 more refilled (800 s at 0.01/s).
        let l = lease(store, &check(&key, 8.0), 2.0).await;
        assert_eq!(l.granted, 2.0, "{name}");
        assert!(l.state.enough && l.state.remaining < 1e-3, "{name} {l:?}");
        assert!((l.state.wait - 800.0).abs() < 1.0, "{name} {l:?}");
        // Empty: nothing, and nothing taken.
        let l = lease(store, &check(&key, 8.0), 2.0).await;
        assert_eq!(l.granted, 0.0, "{name}");
        assert!(!l.state.enough, "{name}");
        assert!((l.state.wait - 800.0).abs() < 1.0, "{name} {l:?}");
    }
    assert!(tokens(&server, &key, 10.0, 0.01) < 0.01);
    // State fleetlimit did not write (another type, text): a full bucket,
    // written over with its expiry.
    for garbage in [&["HSET", &key, "f", "v"][..], &["SET", &key, "1e400"][..]] {
        server.cli(&["DEL", &key]).unwrap();
        server.cli(garbage).unwrap();
        let l = lease(&redis, &check(&key, 8.0), 2.0).await;
        assert_eq!(l.granted, 8.0, "{garbage:?}");
        assert!(tokens(&server, &key, 10.0, 0.01) < 2.01);
    }
    server.assert_every_key_expires(&prefix("store"));
    // A cost above the capacity: nothing, whatever is free.
    server.cli(&["DEL", &key]).unwrap();
    let l = lease(&redis, &check(&key, 24.0), 12.0).await;
    assert_eq!(l.granted, 0.0);
    assert_eq!(server.cli(&["EXISTS", &key]).unwrap().trim(), "0");
}

/// A lease asked for while Redis is frozen: the request gets the route's
/// answer (503, `closed`), and after the thaw the key holds exactly what
/// the answers the instance received took: the frozen lease ran after its
/// bound (nothing taken) or was given back.
#[tokio::test]
async fn a_lease_given_up_on_during_a_freeze_takes_nothing() {
    let server = RedisServer::start();
    let prefix = prefix("lease-freeze");
    let cfg = redis_config(
        &server,
        &prefix,
        "50ms",
        &limits("lease_batch = 10\nlease_above = 1"),
    );
    let app = ok_app(cfg).await;
    let hot = || request("GET", "/", "127.0.0.1:1", &[("x-api-key", "hot")]);
    // One to Redis, then a lease of 10 spent: 89 left.
    for _ in 0..11 {
        assert_eq!(send(&app, hot()).await.status(), 200);
    }
    let key = header_key(&prefix, "hot", "hot");
    let left = || tokens(&server, &key, 100.0, 1.0 / 86_400.0);
    assert!((left() - 89.0).abs() < 0.01, "{}", left());
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    server.freeze();
    // The next lease is asked for, into the freeze.
    let status = send(&app, hot()).await.status();
    server.thaw();
    assert_eq!(status, 503);
    // The frozen call runs once Redis wakes (then a give-back, had it
    // taken anything: settled within fred's timeout, given back within the
    // give-back wait of 5 s); 10 s is well past both.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < until && server.script_calls() == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(server.script_calls() >= 1, "the frozen lease ran");
    while std::time::Instant::now() < until && (left() - 89.0).abs() >= 0.01 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!((left() - 89.0).abs() < 0.01, "{}", left());
    // Redis answers again: a lease is taken from the same bucket.
    assert_eq!(send(&app, hot()).await.status(), 200);
    assert!((left() - 79.0).abs() < 0.01, "{}", left());
}
