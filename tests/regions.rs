//! Global limits across regions (`[regions]`, `scope = "global"`): three
//! `redis-server`s as three regions, two instances in each, every
//! exchange link (one per ordered pair of regions) through a relay that
//! adds a round trip and can be cut. Requests are paced in real time; every
//! scenario checks the hard bound on every window: fleet-wide, a global
//! key is never admitted more than burst + refill × window.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::regions::{Answer, Fleet, drive};
use support::stats::{Parts, Region};
use support::*;

/// The exchange's interval: quotas move once per interval. Every other
/// time here is this one scaled (the refill, the windows, the relays'
/// round trip, the scenarios' lengths), so a shorter interval runs the
/// same scenarios, with the same counts per window, in less time.
const INTERVAL: Duration = Duration::from_millis(500);
/// The global limit: a burst of `BURST`, refilled at `RATE` a second: a
/// burst's worth each interval.
const BURST: f64 = 50.0;
const RATE: f64 = BURST / (INTERVAL.as_millis() as f64 / 1000.0);
/// Each window the bound is checked over: one interval.
const WINDOW: Duration = INTERVAL;
/// Between regions: each command to another region's Redis is held this
/// long by its relay (a fiftieth of the interval).
const RTT: Duration = Duration::from_millis(INTERVAL.as_millis() as u64 / 50);

/// The fleet with the limit refilled at `RATE`, quotas moved once per
/// `INTERVAL`.
async fn fleet(test: &str) -> Fleet {
    fleet_at(test, RATE, INTERVAL).await
}

/// With the limit refilled at `rate` a second, and quotas moved once per
/// `interval`.
async fn fleet_at(test: &str, rate: f64, interval: Duration) -> Fleet {
    Fleet::start(test, interval, RTT, [(BURST, rate); 3]).await
}

impl Fleet {
    /// Prints what a scenario admitted, per window, as a share of the
    /// limit's refill, and what the exchange cost (docs/regions.md's
    /// table is made of these lines: `-- --nocapture`).
    fn report(&self, scenario: &str, counts: &[u64]) {
        let per = |c: u64| c as f64 / (RATE * WINDOW.as_secs_f64());
        let min = counts.iter().copied().min().map_or(0.0, per);
        let max = counts.iter().copied().max().map_or(0.0, per);
        let mean = per(counts.iter().sum::<u64>()) / counts.len().max(1) as f64;
        let stats: Vec<Region> = self
            .layers
            .iter()
            .flatten()
            .filter_map(|l| l.region())
            .collect();
        let calls: u64 = stats.iter().map(|s| s.calls).sum();
        let cycles: u64 = stats.iter().map(|s| s.cycles).sum();
        let moved: u64 = stats.iter().map(|s| s.moved).sum();
        eprintln!(
            "figures: {scenario}: {} windows, admitted ÷ refill per window min {min:.2} mean {mean:.2} max {max:.2}; \
             exchange: {cycles} cycles, {calls} calls by 6 instances, {:.2} of a limit moved",
            counts.len(),
            moved as f64 / 1e6
        );
    }

    /// Region `x`'s share of API key `value` in its Redis, in parts per
    /// million (none recorded: a third).
    fn share(&self, x: usize, value: &str) -> u64 {
        let key = header_key(&self.prefix, "api", value);
        let hash = format!("{}:regions:{{api}}:share", self.prefix);
        self.servers[x]
            .cli(&["HGET", &hash, &key])
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(333_333)
    }
}

/// Admitted answers of `regions` in each window of `answers` after `skip`,
/// counted by when they were answered, and the longest a request took
/// (a decision was made between sending and answering).
fn admitted_per_window(
    answers: &[Answer],
    regions: &[usize],
    skip: Duration,
) -> (Vec<u64>, Duration) {
    let start = answers.iter().map(|a| a.sent).min().unwrap() + skip;
    let end = answers.iter().map(|a| a.at).max().unwrap();
    let n = ((end - start).as_secs_f64() / WINDOW.as_secs_f64()).floor() as usize;
    let mut counts = vec![0u64; n];
    let mut slowest = Duration::ZERO;
    for a in answers.iter().filter(|a| regions.contains(&a.region)) {
        slowest = slowest.max(a.at - a.sent);
        if a.status != 200 || a.at < start {
            continue;
        }
        let w = ((a.at - start).as_secs_f64() / WINDOW.as_secs_f64()) as usize;
        if w < n {
            counts[w] += 1;
        }
    }
    (counts, slowest)
}

/// The hard bound of `share` (parts per million) of the limit over a
/// window stretched by `slowest`: decisions are made between a request's
/// sending and its answer.
fn bound(share: f64, slowest: Duration) -> f64 {
    share * (BURST + RATE * (WINDOW + slowest).as_secs_f64())
}

fn assert_bound(answers: &[Answer], regions: &[usize], share: f64, what: &str) {
    let (counts, slowest) = admitted_per_window(answers, regions, Duration::ZERO);
    assert!(counts.len() >= 2, "{what}: too few windows ({counts:?})");
    // Each window, and every run of windows from the first: a bucket
    // admits at most its burst and its refill over the time elapsed.
    let mut total = 0;
    for (w, &c) in counts.iter().enumerate() {
        let max = bound(share, slowest);
        assert!(
            c as f64 <= max,
            "{what}: window {w} admitted {c}, above the bound {max:.1} ({counts:?})"
        );
        total += c;
        let elapsed = WINDOW * (w as u32 + 1) + slowest;
        let max = share * (BURST + RATE * elapsed.as_secs_f64());
        assert!(
            total as f64 <= max,
            "{what}: {total} admitted in the first {} windows, above {max:.1} ({counts:?})",
            w + 1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_say_the_global_policy_and_what_this_region_can_still_admit() {
    // Its own refill and interval, slower than the others': region a's
    // share is left with two thirds of a token after its 16th request, so
    // its 17th is refused only if all 17 come within the time a third of
    // the refill takes to add a third of a token (200 ms at 5/s, 20 ms at
    // 50/s), and before quota moves: at least an interval and a quarter
    // after the first (6 s at 5 s). Retry-After stays 1 (a third of a
    // token: 200 ms).
    let fleet = fleet_at("regions-headers", 5.0, Duration::from_secs(5)).await;
    // Views are read before the layer is built: decided at once. Each
    // region holds its own third (quota moves a whole interval later).
    let req = request("GET", "/", "10.0.0.1:1000", &[("x-api-key", "h")]);
    let res = send(&fleet.apps[1][0], req).await;
    assert_eq!(res.status(), 200);
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 15);
    let req = request("GET", "/", "10.0.0.1:1000", &[("x-api-key", "h")]);
    let res = send(&fleet.apps[0][0], req).await;
    assert_eq!(res.status(), 200);
    assert_eq!(header_u64(&res, "x-ratelimit-limit"), BURST as u64);
    // A third of the burst, one taken.
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 15);
    // That third spent: refused in this region, with the time its share
    // takes to refill one.
    for _ in 0..15 {
        let req = request("GET", "/", "10.0.0.1:1000", &[("x-api-key", "h")]);
        assert_eq!(send(&fleet.apps[0][1], req).await.status(), 200);
    }
    let req = request("GET", "/", "10.0.0.1:1000", &[("x-api-key", "h")]);
    let res = send(&fleet.apps[0][0], req).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header_u64(&res, "x-ratelimit-limit"), BURST as u64);
    assert_eq!(header_u64(&res, "retry-after"), 1);
}

/// Whole intervals for quotas to follow demand: one to count it, one to
/// take and hold, one to release and push (and the views read).
const CONVERGE: Duration = INTERVAL.saturating_mul(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_asked_in_one_region_reaches_nearly_the_whole_limit_there() {
    let fleet = fleet("regions-one").await;
    let answers = drive(
        &fleet,
        "solo",
        [2.0 * RATE, 0.0, 0.0],
        CONVERGE + 20 * WINDOW,
    )
    .await;
    assert_bound(&answers, &[0, 1, 2], 1.0, "fleet");
    let (counts, _) = admitted_per_window(&answers, &[0], CONVERGE);
    let least = 0.9 * RATE * WINDOW.as_secs_f64();
    for (w, &c) in counts.iter().enumerate() {
        assert!(
            c as f64 >= least,
            "window {w} after three intervals admitted {c}, under 90 % of the limit ({counts:?})"
        );
    }
    assert!(
        fleet.share(0, "solo") >= 900_000,
        "a's share {}",
        fleet.share(0, "solo")
    );
    fleet.report("one region asking, after three intervals", &counts);
    for s in &fleet.servers {
        s.assert_every_key_expires(&fleet.prefix);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twice_the_limit_split_60_30_10_is_admitted_at_90_to_100_percent() {
    let fleet = fleet("regions-split").await;
    let rates = [1.2 * RATE, 0.6 * RATE, 0.2 * RATE];
    let answers = drive(&fleet, "split", rates, CONVERGE + 20 * WINDOW).await;
    assert_bound(&answers, &[0, 1, 2], 1.0, "fleet");
    let (counts, slowest) = admitted_per_window(&answers, &[0, 1, 2], CONVERGE);
    let least = 0.9 * RATE * WINDOW.as_secs_f64();
    let most = bound(1.0, slowest);
    for (w, &c) in counts.iter().enumerate() {
        assert!(
            c as f64 >= least && c as f64 <= most,
            "window {w} after convergence admitted {c}, not within 90 %–100 % ({counts:?})"
        );
    }
    let shares: Vec<u64> = (0..3).map(|x| fleet.share(x, "split")).collect();
    assert!(shares.iter().sum::<u64>() <= 1_000_000, "{shares:?}");
    fleet.report(
        "60/30/10 at twice the limit, after three intervals",
        &counts,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_region_keeps_its_quota_and_the_others_stay_under_the_rest() {
    let fleet = fleet("regions-cut").await;
    let rates = [1.2 * RATE, 0.6 * RATE, 0.2 * RATE];
    let before = drive(&fleet, "cut", rates, CONVERGE).await;
    assert_bound(&before, &[0, 1, 2], 1.0, "before the cut");
    fleet.isolate(2);
    let c_share = fleet.share(2, "cut") as f64 / 1e6;
    let during = drive(&fleet, "cut", rates, 30 * WINDOW).await;
    assert_bound(&during, &[0, 1, 2], 1.0, "fleet, cut");
    assert_bound(&during, &[0, 1], 1.0 - c_share, "a and b, c cut off");
    // C keeps deciding with its last quota: it admits, never fails.
    let (c_counts, _) = admitted_per_window(&during, &[2], Duration::ZERO);
    assert!(
        c_counts.iter().sum::<u64>() > 0,
        "c admitted nothing: {c_counts:?}"
    );
    assert!(
        during
            .iter()
            .filter(|a| a.region == 2)
            .all(|a| a.status != 503)
    );
    fleet.heal(2);
    let after = drive(&fleet, "cut", rates, CONVERGE + 10 * WINDOW).await;
    assert_bound(&after, &[0, 1, 2], 1.0, "after the heal");
    let (counts, _) = admitted_per_window(&after, &[0, 1, 2], CONVERGE);
    let least = 0.9 * RATE * WINDOW.as_secs_f64();
    for (w, &c) in counts.iter().enumerate() {
        assert!(
            c as f64 >= least,
            "window {w} after the heal admitted {c} ({counts:?})"
        );
    }
    let (ab, _) = admitted_per_window(&during, &[0, 1], Duration::ZERO);
    let refill = RATE * WINDOW.as_secs_f64();
    let part = ab.iter().sum::<u64>() as f64 / (ab.len() as f64 * refill * (1.0 - c_share));
    eprintln!(
        "figures: c cut off holding {c_share:.3} of the limit: a and b admitted {part:.2} of the rest"
    );
    fleet.report("after the heal, after three intervals", &counts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_without_its_redis_follows_its_policy_and_the_others_are_unchanged() {
    let fleet = fleet("regions-down").await;
    let rates = [1.2 * RATE, 0.6 * RATE, 0.2 * RATE];
    let before = drive(&fleet, "down", rates, CONVERGE + 5 * WINDOW).await;
    assert_bound(&before, &[0, 1, 2], 1.0, "before");
    let (ab_before, _) = admitted_per_window(&before, &[0, 1], CONVERGE);
    fleet.servers[2].kill();
    let during = drive(&fleet, "down", rates, 20 * WINDOW).await;
    assert_bound(&during, &[0, 1, 2], 1.0, "c down");
    // C's route is `closed`: 503 (or a refusal it remembers), never 500,
    // never admitted.
    let c: Vec<u16> = during
        .iter()
        .filter(|a| a.region == 2)
        .map(|a| a.status)
        .collect();
    assert!(c.iter().all(|&s| s == 503 || s == 429), "{c:?}");
    assert!(
        c.iter().filter(|&&s| s == 503).count() * 2 > c.len(),
        "{c:?}"
    );
    let (ab_during, _) = admitted_per_window(&during, &[0, 1], Duration::ZERO);
    let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len() as f64;
    let (b, d) = (mean(&ab_before), mean(&ab_during));
    fleet.report("a and b while c's Redis is down", &ab_during);
    assert!(
        (d - b).abs() <= 0.1 * b,
        "a and b admitted {d:.1} a window with c down, {b:.1} before ({ab_before:?} → {ab_during:?})"
    );
}

/// A global limit is decided on the configuration's own Redis: a layer on
/// another store is refused when it is built, never at request time.
#[tokio::test]
async fn a_global_limit_on_another_store_is_refused_when_the_layer_is_built() {
    let body = r#"
[regions]
this = "a"
[regions.exchange]
a = "redis://127.0.0.1:1"
b = "redis://127.0.0.1:2"

[limits.api]
key = "header:x-api-key"
capacity = 5
refill = "1/s"
scope = "global"

[default]
limits = ["api"]
"#;
    let cfg = config_at("redis://127.0.0.1:1", "regions-store", "5ms", body);
    let why = |e: fleetlimit::BuildError| e.to_string();
    let in_memory = fleetlimit::RateLimitLayer::with_store(
        cfg.clone(),
        Arc::new(fleetlimit::store::MemoryStore::new(100)),
    )
    .await
    .map(|_| ())
    .map_err(why);
    let err = in_memory.unwrap_err();
    assert!(err.contains("limit \"api\" is global"), "{err}");
    let without = fleetlimit::RateLimitLayer::new(cfg.clone().without_redis()).await;
    let err = without.map(|_| ()).map_err(why).unwrap_err();
    assert!(err.contains("own Redis"), "{err}");
    // The same configuration on its Redis builds (Redis down: it decides
    // by `on_redis_error` until Redis answers).
    assert!(fleetlimit::RateLimitLayer::new(cfg).await.is_ok());
}

/// The receiving region's rescale (`lua/token_bucket_rescale.lua`): a
/// bucket keeps the tokens it holds when its share grows, never gains any;
/// a missing key is a bucket full at the old share; a value that is not a
/// bucket's is one too; every key it writes expires.
#[tokio::test]
async fn a_bucket_rescaled_to_a_larger_share_keeps_its_tokens() {
    // The script's own limit, not the exchange's, refilled slowly: the
    // tokens are read by redis-cli calls that a busy machine spaces out.
    // A third of it refills a token in 600 ms, so the half-full bucket
    // reads within (7, 9) unless its reads are ~400 ms apart (at 50/s, as
    // before, 40 ms apart failed it under a CPU hog).
    const BURST: f64 = 50.0;
    const RATE: f64 = 5.0;
    const RESCALE: &str = concat!(
        include_str!("../lua/token_bucket.lua"),
        include_str!("../lua/token_bucket_rescale.lua")
    );
    let server = RedisServer::start();
    let (third, two_thirds) = (333_333.0, 666_666.0);
    let tokens = |key: &str, share: f64| {
        let s = share / 1e6;
        tokens(&server, key, BURST * s, RATE * s)
    };
    // The burst as the checks send it: capacity ÷ refill in µs, plus slack.
    let burst = format!("{}", BURST / RATE * 1e6 + 0.5);
    let rescale = |key: &str| {
        let out = server.cli(&["EVAL", RESCALE, "1", key, &burst, "333333", "666666"]);
        out.unwrap().trim().to_owned()
    };
    let now = || {
        let t = server.cli(&["TIME"]).unwrap();
        let mut it = t.lines().map(|l| l.trim().parse::<f64>().unwrap());
        it.next().unwrap() * 1e6 + it.next().unwrap()
    };
    // Half full at a third of the limit.
    let tat = format!("{}", now() + 0.5 * BURST / RATE * 1e6);
    server.cli(&["SET", "half", &tat, "PX", "60000"]).unwrap();
    let t0 = Instant::now();
    let before = tokens("half", third);
    assert_eq!(rescale("half"), "1");
    let after = tokens("half", two_thirds);
    // At most what refill at the larger share adds meanwhile.
    let refill = RATE * two_thirds / 1e6 * t0.elapsed().as_secs_f64();
    assert!(
        after >= before - 0.01 && after <= before + refill + 0.01,
        "{before} tokens at a third, {after} at two thirds"
    );
    assert!(before > 7.0 && before < 9.0, "{before}");
    // Missing, and not a bucket's: full at the old share, written with an
    // expiry.
    server.cli(&["SET", "junk", "garbage"]).unwrap();
    for key in ["missing", "junk"] {
        let t0 = Instant::now();
        assert_eq!(rescale(key), "1", "{key}");
        let full = BURST / 3.0;
        let after = tokens(key, two_thirds);
        let refill = RATE * two_thirds / 1e6 * t0.elapsed().as_secs_f64();
        assert!(
            after >= full - 0.01 && after <= full + refill + 0.01,
            "{key}: {after}"
        );
        let ttl: i64 = server.cli(&["PTTL", key]).unwrap().trim().parse().unwrap();
        assert!(ttl > 0, "{key}: PTTL {ttl}");
    }
}

/// A share in a region's hash that is not a number is read as none: that
/// key alone is refused there (never a 500), the others are untouched,
/// and the exchange repairs it with quota from the other regions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_share_refuses_that_key_alone_until_the_exchange_repairs_it() {
    let fleet = fleet("regions-garbage").await;
    let hash = format!("{}:regions:{{api}}:share", fleet.prefix);
    let bad = header_key(&fleet.prefix, "api", "bad");
    fleet.servers[0]
        .cli(&["HSET", &hash, &bad, "not a share"])
        .unwrap();
    // Read by the views within a quarter interval.
    tokio::time::sleep(INTERVAL / 2).await;
    let status = |x: usize, value: &'static str| {
        let app = fleet.apps[x][0].clone();
        async move {
            let req = request("GET", "/", "10.0.0.1:1000", &[("x-api-key", value)]);
            send(&app, req).await.status().as_u16()
        }
    };
    assert_eq!(status(0, "bad").await, 429);
    assert_eq!(status(0, "good").await, 200);
    assert_eq!(status(1, "bad").await, 200);
    // Asked for in a, the key's quota comes back there.
    let answers = drive(&fleet, "bad", [RATE, 0.0, 0.0], CONVERGE + 3 * WINDOW).await;
    assert!(answers.iter().all(|a| a.status == 200 || a.status == 429));
    assert_bound(&answers, &[0, 1, 2], 1.0, "fleet");
    let (counts, _) = admitted_per_window(&answers, &[0], CONVERGE);
    assert!(
        counts.iter().all(|&c| c > 0),
        "a never admitted \"bad\" again: {counts:?}"
    );
    assert!(fleet.share(0, "bad") > 0);
}
