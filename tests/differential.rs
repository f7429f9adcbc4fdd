//! Differential property test: for random valid configurations (capacity,
//! rate, window, cost) and request timings, the in-process store and Redis
//! make the same decisions.
//!
//! Redis decides on its own clock (`TIME`), which a test cannot pause, so a
//! request's time is known only between sending it and its answer. Each
//! sequence is therefore also decided in exact arithmetic over those
//! intervals: a token bucket's room grows with the time of the check and
//! shrinks with the times of earlier charges, so the interval ends bound it;
//! a window is open or closed unless its end falls within the interval. A
//! decision that no time within the intervals could change is *compared*:
//! both stores must give it, per limit too, and report a remaining within
//! the model's range. The others are *undecided* and only counted; if the
//! two stores decided one differently their states part, and the rest of
//! that sequence is not compared. Most requests must be compared.
//!
//! The intervals also carry what the stores may legitimately round: Redis's
//! integer µs clock and its ¼ µs steps per charge, the 0.5 µs slack, and a
//! drift of 0.1 % between Redis's wall clock and the test's monotonic one.
//!
//! Sliding windows are left out: the in-process store aligns them to its
//! own start and Redis to Unix time, so their boundaries differ by design.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fleetlimit::Config;
use fleetlimit::configuration::{KeySource, LimitConfig, Rate, RouteConfig};
use fleetlimit::store::{Bucket, Check, MemoryStore, Outcome, RedisStore, Rule, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use support::RedisServer;

/// Which script the Redis side runs.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// One token bucket: the lean script (through the coalescing batcher).
    Lean,
    /// Two token buckets, all or nothing: the general script.
    Pair,
    /// One fixed window: the general script.
    Fixed,
}

#[derive(Clone, Debug)]
struct Case {
    kind: Kind,
    /// Capacities (a window's limit is the first).
    caps: [u64; 2],
    /// Each bucket's token period in µs.
    periods_us: [f64; 2],
    window_ms: u64,
    /// Each request's cost and the pause before it.
    requests: Vec<(u64, u64)>,
}

fn case() -> impl Strategy<Value = Case> {
    let cap = prop_oneof![3 => 1u64..=10, 1 => 1u64..=100_000];
    // 1 µs (the fastest refill allowed) to 10 s per token, log-uniform.
    let period = (0.0f64..7.0).prop_map(|e| 10f64.powf(e));
    (
        prop_oneof![Just(Kind::Lean), Just(Kind::Pair), Just(Kind::Fixed)],
        [cap.clone(), cap],
        [period.clone(), period],
        20u64..=300,
        prop::collection::vec((0.0f64..1.0, prop::bool::weighted(0.2), 0u64..=15), 1..=10),
    )
        .prop_map(|(kind, caps, periods_us, window_ms, raw)| {
            let most = match kind {
                Kind::Pair => caps[0].min(caps[1]),
                _ => caps[0],
            };
            let requests = raw
                .into_iter()
                .map(|(f, all, gap)| {
                    // Mostly small costs, sometimes the whole capacity.
                    let cost = if all {
                        most
                    } else {
                        1 + ((most - 1) as f64 * f * f) as u64
                    };
                    (cost.clamp(1, most), gap)
                })
                .collect();
            Case {
                kind,
                caps,
                periods_us,
                window_ms,
                requests,
            }
        })
}

impl Case {
    fn rules(&self) -> Vec<Rule> {
        let tb = |i: usize| Rule::TokenBucket {
            capacity: self.caps[i] as f64,
            refill_per_sec: 1e6 / self.periods_us[i],
        };
        match self.kind {
            Kind::Lean => vec![tb(0)],
            Kind::Pair => vec![tb(0), tb(1)],
            Kind::Fixed => vec![Rule::FixedWindow {
                limit: self.caps[0] as f64,
                window: Duration::from_millis(self.window_ms),
            }],
        }
    }

    /// The same numbers as a configuration: they must pass validation.
    fn config(&self) -> Result<Config, fleetlimit::ConfigError> {
        let most = self.requests.iter().map(|r| r.0).max().unwrap_or(1) as u32;
        let mut b = Config::builder();
        let mut names = Vec::new();
        for (i, rule) in self.rules().into_iter().enumerate() {
            let limit = match rule {
                Rule::TokenBucket { refill_per_sec, .. } => LimitConfig::token_bucket(
                    KeySource::Global,
                    self.caps[i],
                    format!("{refill_per_sec}/s").parse::<Rate>().unwrap(),
                ),
                _ => LimitConfig::fixed_window(
                    KeySource::Global,
                    self.caps[0],
                    Duration::from_millis(self.window_ms),
                ),
            };
            b = b.limit(format!("l{i}"), limit);
            names.push(format!("l{i}"));
        }
        b.route("/", RouteConfig::new(names).cost(most)).build()
    }
}

/// One bucket decided in exact arithmetic over time intervals (seconds
/// since the sequence's first request).
#[derive(Debug)]
enum Model {
    Bucket {
        per: f64,
        cap: f64,
        /// The earliest and latest the bucket's TAT can be.
        tat: (f64, f64),
    },
    Window {
        w: f64,
        limit: f64,
        count: f64,
        /// When it opened, at the earliest and latest.
        start: Option<(f64, f64)>,
    },
}

/// How far from its end a window counts as surely open or closed: Redis
/// sets and checks expiries in whole milliseconds.
const EXPIRY_SLOP: f64 = 2e-3;

impl Model {
    fn new(rule: Rule) -> Self {
        match rule {
            Rule::TokenBucket {
                capacity,
                refill_per_sec,
            } => Self::Bucket {
                per: 1.0 / refill_per_sec,
                cap: capacity,
                tat: (f64::NEG_INFINITY, f64::NEG_INFINITY),
            },
            Rule::FixedWindow { limit, window } | Rule::SlidingWindow { limit, window } => {
                Self::Window {
                    w: window.as_secs_f64(),
                    limit,
                    count: 0.0,
                    start: None,
                }
            }
            Rule::Concurrency { .. } => unreachable!("the generator makes no concurrency limit"),
        }
    }

    /// The least and most room at a time within `t`; `None` when a window
    /// may or may not have closed by then.
    fn room(&mut self, t: (f64, f64)) -> Option<(f64, f64)> {
        match self {
            Self::Bucket { per, cap, tat } => {
                let at = |t: f64, tat: f64| {
                    if tat <= t {
                        *cap
                    } else {
                        (*cap - (tat - t) / *per).min(*cap)
                    }
                };
                Some((at(t.0, tat.1), at(t.1, tat.0)))
            }
            Self::Window {
                w,
                limit,
                count,
                start,
            } => {
                if let Some(s) = *start {
                    if t.0 > s.1 + *w + EXPIRY_SLOP {
                        *start = None;
                        *count = 0.0;
                    } else if t.1 >= s.0 + *w - EXPIRY_SLOP {
                        return None;
                    }
                }
                Some((*limit - *count, *limit - *count))
            }
        }
    }

    /// What Redis may round a bucket's remaining by, in tokens, after
    /// `charges` charges (¼ µs each, this one's included, and the slack).
    fn rounding(&self, charges: f64) -> f64 {
        match self {
            Self::Bucket { per, .. } => (0.25e-6 * (charges + 1.0) + 1e-6) / per,
            Self::Window { .. } => 0.0,
        }
    }

    fn charge(&mut self, t: (f64, f64), cost: f64) {
        match self {
            Self::Bucket { per, tat, .. } => {
                tat.0 = tat.0.max(t.0) + cost * *per;
                tat.1 = tat.1.max(t.1) + cost * *per;
            }
            Self::Window { count, start, .. } => {
                *count += cost;
                start.get_or_insert(t);
            }
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    requests: usize,
    compared: usize,
    /// Of those compared, refusals.
    refused: usize,
    undecided: usize,
    /// Not compared after the stores decided an undecided request apart.
    parted: usize,
}

/// When a store decided: the test's clock before and after, in seconds.
/// The in-process store's answer: its future is ready at once.
fn check_now(store: &MemoryStore, check: &Check) -> Outcome {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::pin!(store.check(check)).poll(&mut cx) {
        std::task::Poll::Ready(outcome) => outcome.expect("the in-process store never fails"),
        std::task::Poll::Pending => panic!("the in-process store answered later"),
    }
}

fn timed(t0: Instant, f: impl FnOnce() -> Outcome) -> ((f64, f64), Outcome) {
    let lo = t0.elapsed().as_secs_f64();
    let o = f();
    ((lo, t0.elapsed().as_secs_f64()), o)
}

async fn run_case(
    case: &Case,
    n: usize,
    redis: &RedisStore,
    memory: &MemoryStore,
) -> Result<Tally, String> {
    case.config()
        .map_err(|e| format!("not a valid case: {e}"))?;
    let rules = case.rules();
    let buckets: Vec<Bucket> = rules
        .iter()
        .enumerate()
        .map(|(i, r)| Bucket {
            key: format!("diff:{n}:{i}"),
            rule: *r,
            shadow: false,
        })
        .collect();
    let mut models: Vec<Model> = rules.iter().copied().map(Model::new).collect();
    let mut tally = Tally::default();
    let t0 = Instant::now();
    let mut first: Option<((f64, f64), (f64, f64))> = None;
    let mut charges = 0.0;
    for (i, &(cost, gap)) in case.requests.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(gap)).await;
        tally.requests += 1;
        let check = Check {
            slot: None,
            cost: cost as f64,
            buckets: buckets.clone(),
        };
        let lo = t0.elapsed().as_secs_f64();
        let r = redis
            .check(&check)
            .await
            .map_err(|e| format!("request {i}: Redis failed: {e}"))?;
        let r_at = (lo, t0.elapsed().as_secs_f64());
        let (m_at, m) = timed(t0, || check_now(memory, &check));
        // Seconds since each store's first request, at the least and most.
        let (r0, m0) = *first.get_or_insert((r_at, m_at));
        let t = if i == 0 {
            (0.0, 0.0)
        } else {
            let since = |at: (f64, f64), at0: (f64, f64)| (at.0 - at0.1, at.1 - at0.0);
            let (r_e, m_e) = (since(r_at, r0), since(m_at, m0));
            let latest = r_e.1.max(m_e.1);
            let slop = 3e-6 + 1e-3 * latest + 0.25e-6 * charges;
            (r_e.0.min(m_e.0) - slop, latest + slop)
        };
        let Some(rooms) = models
            .iter_mut()
            .map(|m| m.room(t))
            .collect::<Option<Vec<_>>>()
        else {
            // A window that may or may not have closed: nothing after this
            // can be modelled.
            tally.undecided += case.requests.len() - i;
            tally.requests += case.requests.len() - i - 1;
            return Ok(tally);
        };
        let what = || {
            format!(
                "request {i} (cost {cost}, t {t:?}): redis {r:?}, memory {m:?}, model {models:?}"
            )
        };
        let c = cost as f64;
        let enough: Vec<Option<bool>> = rooms
            .iter()
            .map(|&(lo, hi)| {
                if lo >= c {
                    Some(true)
                } else if hi < c {
                    Some(false)
                } else {
                    None
                }
            })
            .collect();
        let allowed = if enough.contains(&Some(false)) {
            Some(false)
        } else if enough.iter().all(Option::is_some) {
            Some(true)
        } else {
            None
        };
        match allowed {
            Some(a) => {
                if r.allowed != a || m.allowed != a {
                    return Err(format!("allowed should be {a}: {}", what()));
                }
                for (b, e) in enough.iter().enumerate() {
                    if let Some(e) = *e {
                        if r.limits[b].enough != e || m.limits[b].enough != e {
                            return Err(format!("limit {b}: enough should be {e}: {}", what()));
                        }
                    }
                }
                tally.compared += 1;
                tally.refused += usize::from(!a);
            }
            None => {
                tally.undecided += 1;
                if r.allowed != m.allowed {
                    tally.parted += case.requests.len() - i - 1;
                    tally.requests += case.requests.len() - i - 1;
                    return Ok(tally);
                }
            }
        }
        let taken = if r.allowed { c } else { 0.0 };
        for (b, &(lo, hi)) in rooms.iter().enumerate() {
            let tol = 1e-9 * (1.0 + lo.abs().max(hi.abs())) + models[b].rounding(charges);
            for (store, o) in [("redis", &r), ("memory", &m)] {
                let rem = o.limits[b].remaining;
                if rem < lo - taken - tol || rem > hi - taken + tol {
                    return Err(format!(
                        "limit {b}: {store} remaining {rem} outside [{}, {}]: {}",
                        lo - taken,
                        hi - taken,
                        what()
                    ));
                }
            }
        }
        if r.allowed {
            charges += 1.0;
            for model in &mut models {
                model.charge(t, c);
            }
        }
    }
    Ok(tally)
}

#[test]
fn the_in_process_store_and_redis_decide_alike() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (redis, memory) = rt.block_on(async {
        let redis = server.coalescing_store(Duration::from_secs(2)).await;
        (redis, MemoryStore::new(100_000))
    });
    let cases = AtomicUsize::new(0);
    let tally = Mutex::new(Tally::default());
    // Bounded: 64 sequences of at most 10 requests and 150 ms of pauses,
    // each check within its 2 s deadline; a failure shrinks at most 64 times.
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 64,
        max_shrink_iters: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let started = Instant::now();
    let result = runner.run(&case(), |case| {
        let n = cases.fetch_add(1, Ordering::Relaxed);
        let t = rt
            .block_on(run_case(&case, n, &redis, &memory))
            .map_err(TestCaseError::fail)?;
        let mut all = tally.lock().unwrap();
        all.requests += t.requests;
        all.compared += t.compared;
        all.refused += t.refused;
        all.undecided += t.undecided;
        all.parted += t.parted;
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let t = *tally.lock().unwrap();
    eprintln!("{t:?} in {:?}", started.elapsed());
    // Most requests are decided beyond any timing doubt, and compared.
    assert!(t.compared * 10 >= t.requests * 7, "too few compared: {t:?}");
    // And they are not all easy admissions of a full bucket.
    assert!(t.refused * 10 >= t.compared, "too few refusals: {t:?}");
}

/// A key whose rule changes (a caller's plan, or the `local` share when the
/// fleet size changes) carries the time it owes over to the new rule, in
/// the in-process store as in Redis: a downgrade does not forgive what was
/// spent, an upgrade keeps what was left. Refill of 1/s or slower keeps the
/// answers far from any timing doubt.
#[test]
fn a_rule_change_carries_the_time_owed_in_both_stores() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let redis = server
            .store(Duration::from_secs(2), Duration::from_secs(2), false)
            .await;
        let memory = MemoryStore::new(1_000);
        let tb = |capacity: f64, refill_per_sec: f64| Rule::TokenBucket {
            capacity,
            refill_per_sec,
        };
        let check = |key: &str, rule: Rule, cost: f64| Check {
            slot: None,
            cost,
            buckets: vec![Bucket {
                key: key.into(),
                rule,
                shadow: false,
            }],
        };
        let stores: [&dyn Store; 2] = [&redis, &memory];
        for (name, store) in ["redis", "memory"].iter().zip(stores) {
            // Pro (100 at 1/s) spends 60, then the key is on free (10 at 1/s):
            // it owes 50 s, so free refuses and waits about 51 s.
            let pro = store
                .check(&check("rl:plan:{down}", tb(100.0, 1.0), 60.0))
                .await
                .unwrap();
            assert!(pro.allowed, "{name}: {pro:?}");
            let free = store
                .check(&check("rl:plan:{down}", tb(10.0, 1.0), 1.0))
                .await
                .unwrap();
            assert!(
                !free.allowed,
                "{name}: a downgrade forgave the spent tokens: {free:?}"
            );
            let wait = free.limits[0].wait;
            assert!((50.0..52.0).contains(&wait), "{name}: wait {wait}");
            // Free (10 at 1/s) spends 5, then pro (100 at 10/s): 5 s owed is
            // 50 tokens of pro's 100, so 49 are left after one more.
            let free = store
                .check(&check("rl:plan:{up}", tb(10.0, 1.0), 5.0))
                .await
                .unwrap();
            assert!(free.allowed, "{name}: {free:?}");
            let pro = store
                .check(&check("rl:plan:{up}", tb(100.0, 10.0), 1.0))
                .await
                .unwrap();
            let left = pro.limits[0].remaining;
            assert!(
                pro.allowed && (48.5..50.5).contains(&left),
                "{name}: {pro:?}"
            );
        }
    });
}
