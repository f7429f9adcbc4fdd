//! A check its caller stopped waiting for changes nothing. Three instances
//! send traffic (coalesced batches in flight on the token-bucket routes)
//! to a route per algorithm and failure policy while Redis is frozen
//! (SIGSTOP), the network to it is cut (every connection reset, new ones
//! refused) or held (nothing forwarded, all of it delivered later, as TCP
//! does after a partition); afterwards each key's state in Redis is
//! exactly the units of the answers the instances got from Redis, in every
//! trial. And a check Redis answers just inside its deadline is charged.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use fleetlimit::RateLimitLayer;
use support::relay::Relay;
use support::*;

/// Trials per fault.
const TRIALS: usize = 20;
/// The deadline of these tests' checks.
const DEADLINE: &str = "20ms";
/// Rounds of requests a route's traffic task sends at most per trial, and
/// requests per round at most (token-bucket routes send 4, to coalesce).
const ROUNDS: usize = 2_000;
const AT_ONCE: usize = 4;
/// Whole units a key holds: more than a trial can send from its three
/// instances however fast the machine (every task stops after [`ROUNDS`]),
/// so nothing is refused and every admitted answer is one unit.
const CAPACITY: u64 = (ROUNDS * AT_ONCE * 3) as u64;

const ALGORITHMS: [&str; 4] = ["tb", "fw", "sw", "two"];
const POLICIES: [&str; 3] = ["open", "closed", "local"];

/// A limit per algorithm and policy (its key: the `x-account` header),
/// and the route `/<alg>/<policy>` counted against it: `tb` a token bucket
/// (the lean script, coalesced), `fw` a fixed window and `sw` a sliding
/// window (the general script), `two` a token bucket and a fixed window
/// (the general script, all or nothing).
fn body() -> String {
    let mut b = String::from("[fleet]\nsize = 3\n\n");
    for p in POLICIES {
        b += &format!(
            "[limits.tb-{p}]\nkey = \"account:x-account\"\ncapacity = {CAPACITY}\nrefill = \"10/d\"\n\n\
             [limits.fw-{p}]\nkey = \"account:x-account\"\nalgorithm = \"fixed-window\"\nlimit = {CAPACITY}\nwindow = \"1d\"\n\n\
             [limits.sw-{p}]\nkey = \"account:x-account\"\nalgorithm = \"sliding-window\"\nlimit = {CAPACITY}\nwindow = \"1d\"\n\n\
             [limits.two-tb-{p}]\nkey = \"account:x-account\"\ncapacity = {CAPACITY}\nrefill = \"10/d\"\n\n\
             [limits.two-fw-{p}]\nkey = \"account:x-account\"\nalgorithm = \"fixed-window\"\nlimit = {CAPACITY}\nwindow = \"1d\"\n\n"
        );
        for a in ["tb", "fw", "sw"] {
            b += &format!(
                "[[routes]]\npath = \"/{a}/{p}\"\nlimits = [\"{a}-{p}\"]\non_redis_error = \"{p}\"\n\n"
            );
        }
        b += &format!(
            "[[routes]]\npath = \"/two/{p}\"\nlimits = [\"two-tb-{p}\", \"two-fw-{p}\"]\non_redis_error = \"{p}\"\n\n"
        );
    }
    b
}

fn app(layer: RateLimitLayer) -> Router {
    let paths = ALGORITHMS
        .iter()
        .flat_map(|a| POLICIES.iter().map(move |p| format!("/{a}/{p}")));
    support::ok_routes(layer, paths)
}

/// What the instances were answered, per route.
#[derive(Default, Debug, Clone, Copy)]
struct Tally {
    /// 200 decided by Redis (with `X-RateLimit-Remaining`): one unit each.
    from_redis: u64,
    /// Admitted by `local`'s own buckets (200 naming the limit without
    /// `X-RateLimit-Remaining`): written back to Redis afterwards.
    local: u64,
    /// Answered by the failure policy (200 without the header, 503, or
    /// `local`'s own answers).
    by_policy: u64,
}

struct Traffic {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    tally: Arc<Mutex<HashMap<String, Tally>>>,
}

impl Traffic {
    /// Every instance sends each route's requests for `account`, in rounds
    /// of concurrent requests (four on the token-bucket routes, so checks
    /// queue behind a call in flight and are coalesced), 10 ms apart.
    fn start(apps: &[Router], account: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tally: Arc<Mutex<HashMap<String, Tally>>> = Arc::new(Mutex::new(HashMap::new()));
        let mut tasks = Vec::new();
        for app in apps {
            for a in ALGORITHMS {
                for p in POLICIES {
                    let (app, stop, tally) = (app.clone(), Arc::clone(&stop), Arc::clone(&tally));
                    let (path, account) = (format!("/{a}/{p}"), account.to_owned());
                    let at_once = if a == "tb" { AT_ONCE } else { 2 };
                    tasks.push(tokio::spawn(async move {
                        // Bounded: stopped by the flag, and at most this many rounds.
                        for _ in 0..ROUNDS {
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            let mut round = tokio::task::JoinSet::new();
                            for _ in 0..at_once {
                                let (app, path, account) =
                                    (app.clone(), path.clone(), account.clone());
                                round.spawn(async move {
                                    let req = request(
                                        "GET",
                                        &path,
                                        "127.0.0.1:4000",
                                        &[("x-account", &account)],
                                    );
                                    send(&app, req).await
                                });
                            }
                            while let Some(res) = round.join_next().await {
                                let res = res.unwrap();
                                let status = res.status().as_u16();
                                let decided = header(&res, "x-ratelimit-remaining").is_some();
                                assert!(
                                    matches!(status, 200 | 503),
                                    "{path}: {status} (nothing is refused here)"
                                );
                                let mut t = tally.lock().unwrap();
                                let t = t.entry(path.clone()).or_default();
                                if status == 200 && decided {
                                    t.from_redis += 1;
                                } else {
                                    t.by_policy += 1;
                                    let named = header(&res, "x-ratelimit-limit").is_some();
                                    t.local += u64::from(status == 200 && named);
                                }
                            }
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }));
                }
            }
        }
        Self { stop, tasks, tally }
    }

    async fn stop(self) -> HashMap<String, Tally> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        let t = self.tally.lock().unwrap();
        t.clone()
    }
}

/// The units Redis holds charged for `account` under `limit` of algorithm
/// `alg` (`tb`: a token bucket refilling ten a day, `fw`, `sw`).
fn charged(server: &RedisServer, prefix: &str, limit: &str, alg: &str, account: &str) -> u64 {
    let key = format!("{prefix}:{limit}:{{a:{account}}}");
    if alg == "tb" {
        let Some(tat) = server.tat(&key) else {
            return 0;
        };
        // The TAT, in µs: ten tokens a day, so TAT − now is the units
        // taken less the seconds since the first (2.4 h per unit, far more than a test lasts).
        let time = server.cli(&["TIME"]).unwrap();
        let t: Vec<f64> = time.lines().map(|l| l.trim().parse().unwrap()).collect();
        let now = t[0] * 1e6 + t[1];
        return ((tat - now) / 8_640e6).ceil() as u64;
    }
    let raw = server
        .cli(&["GET", &key])
        .unwrap_or_else(|| panic!("GET {key}"));
    let raw = raw.trim();
    if raw.is_empty() {
        return 0;
    }
    match alg {
        "fw" => raw.parse().unwrap(),
        // "<window index> <current> <previous>"
        "sw" => raw
            .split(' ')
            .skip(1)
            .map(|n| n.parse::<u64>().unwrap())
            .sum(),
        _ => unreachable!("{alg}"),
    }
}

/// Every route's keys hold exactly what Redis answered the instances, and
/// on `local` routes what their buckets admitted too, once it is written
/// back (within [`WRITTEN_BACK_WITHIN`]).
async fn assert_exact(
    server: &RedisServer,
    prefix: &str,
    account: &str,
    tally: &HashMap<String, Tally>,
    what: &str,
) {
    let until = std::time::Instant::now() + WRITTEN_BACK_WITHIN;
    loop {
        let mut wrong = Vec::new();
        for a in ALGORITHMS {
            for p in POLICIES {
                let t = tally.get(&format!("/{a}/{p}")).copied().unwrap_or_default();
                let limits: Vec<(String, &str)> = match a {
                    "two" => vec![(format!("two-tb-{p}"), "tb"), (format!("two-fw-{p}"), "fw")],
                    _ => vec![(format!("{a}-{p}"), a)],
                };
                let want = t.from_redis + if p == "local" { t.local } else { 0 };
                for (limit, alg) in limits {
                    let held = charged(server, prefix, &limit, alg, account);
                    if held != want {
                        wrong.push(format!(
                            "/{a}/{p} ({limit}): Redis holds {held} units, the instances were \
                             answered {} by Redis, {} by the policy ({} admitted locally)",
                            t.from_redis, t.by_policy, t.local
                        ));
                    }
                }
            }
        }
        if wrong.is_empty() {
            return;
        }
        assert!(std::time::Instant::now() < until, "{what}: {wrong:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How long the `local` write-back may take once Redis answers: the
/// breaker's cool-off (500 ms), the write-back's spread (1 s) and its
/// rounds, with room for a busy machine.
const WRITTEN_BACK_WITHIN: Duration = Duration::from_secs(6);

/// Three instances, traffic, `fault` for a while, `heal`, traffic until
/// every route answers from Redis again, then the state is checked.
async fn trials(what: &str, url: &str, server: &RedisServer, fault: impl Fn(), heal: impl Fn()) {
    let prefix = prefix(what);
    let mut apps = Vec::new();
    for _ in 0..3 {
        let cfg = config_at(url, &prefix, DEADLINE, &body());
        apps.push(app(RateLimitLayer::new(cfg).await.unwrap()));
    }
    let mut faulted = 0;
    for trial in 0..TRIALS {
        let account = format!("{what}-{trial}");
        let traffic = Traffic::start(&apps, &account);
        tokio::time::sleep(Duration::from_millis(100)).await;
        fault();
        tokio::time::sleep(Duration::from_millis(300)).await;
        heal();
        // Past the breaker's cool-off (500 ms): Redis decides again.
        tokio::time::sleep(Duration::from_millis(800)).await;
        let tally = traffic.stop().await;
        let policy: u64 = tally.values().map(|t| t.by_policy).sum();
        faulted += u64::from(policy > 0);
        assert_exact(
            server,
            &prefix,
            &account,
            &tally,
            &format!("{what}, trial {trial}"),
        )
        .await;
    }
    // The fault was felt: the tests above are not about a healthy Redis.
    assert!(
        faulted as usize >= TRIALS / 2,
        "{what}: only {faulted} trials saw the fault"
    );
    server.assert_every_key_expires(&prefix);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_frozen_charges_only_what_it_answered() {
    let server = RedisServer::start();
    let url = server.url();
    trials(
        "frozen",
        &url,
        &server,
        || server.freeze(),
        || server.thaw(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_cut_charges_only_what_redis_answered() {
    let server = RedisServer::start();
    let relay = Relay::start(server.port);
    let url = relay.url();
    trials("cut", &url, &server, || relay.cut(), || relay.heal()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_network_delivers_late_and_charges_nothing_late() {
    let server = RedisServer::start();
    let relay = Relay::start(server.port);
    let url = relay.url();
    trials("held", &url, &server, || relay.hold(), || relay.release()).await;
}

/// Redis frozen for a third of the deadline while requests are in flight:
/// every request is answered by Redis after the thaw, inside its deadline,
/// and every one is charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_answered_inside_its_deadline_is_charged() {
    let server = RedisServer::start();
    let prefix = prefix("inside");
    let deadline = Duration::from_millis(600);
    let cfg = config_at(&server.url(), &prefix, "600ms", &body());
    let app = app(RateLimitLayer::new(cfg).await.unwrap());
    let mut tally: HashMap<String, Tally> = HashMap::new();
    for round in 0..5 {
        let mut sent = tokio::task::JoinSet::new();
        server.freeze();
        for a in ALGORITHMS {
            for p in POLICIES {
                for _ in 0..3 {
                    let (app, path) = (app.clone(), format!("/{a}/{p}"));
                    sent.spawn(async move {
                        let req =
                            request("GET", &path, "127.0.0.1:4000", &[("x-account", "inside")]);
                        (path, send(&app, req).await)
                    });
                }
            }
        }
        tokio::time::sleep(deadline / 3).await;
        server.thaw();
        while let Some(done) = sent.join_next().await {
            let (path, res) = done.unwrap();
            assert_eq!(res.status(), 200, "round {round}: {path}");
            assert!(
                header(&res, "x-ratelimit-remaining").is_some(),
                "round {round}: {path} was answered by its policy, not by Redis"
            );
            tally.entry(path).or_default().from_redis += 1;
        }
    }
    assert_exact(&server, &prefix, "inside", &tally, "inside the deadline").await;
    assert!(tally.values().all(|t| t.from_redis == 15));
}

/// The scripts themselves: a call whose "not after" bound has passed on
/// Redis's clock answers `LATE` and writes nothing; without a bound, or
/// before it, the same call charges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_run_after_its_bound_writes_nothing() {
    let server = RedisServer::start();
    let prefix = prefix("bound");
    // Building a layer loads both scripts.
    let cfg = config_at(&server.url(), &prefix, DEADLINE, &body());
    let _app = app(RateLimitLayer::new(cfg).await.unwrap());
    let time = server.cli(&["TIME"]).unwrap();
    let t: Vec<u64> = time.lines().map(|l| l.trim().parse().unwrap()).collect();
    let now = t[0] * 1_000_000 + t[1];
    let (past, future) = (
        (now - 1_000_000).to_string(),
        (now + 60_000_000).to_string(),
    );
    let lean = fleetlimit::store::RedisStore::lean_script_sha();
    let general = fleetlimit::store::RedisStore::script_sha();
    let lean_key = format!("{prefix}:lean");
    let fw_key = format!("{prefix}:fw");
    // One token of 1,000 at one a second: cost × per, burst × per (µs).
    let lean_call = |bound: &str| {
        server
            .cli(&[
                "EVALSHA",
                &lean,
                "1",
                &lean_key,
                bound,
                "1000000",
                "1000000000.5",
            ])
            .unwrap()
    };
    // A fixed window of 1,000 a day, cost 1.
    let fw_call = |bound: &str| {
        server
            .cli(&[
                "EVALSHA", &general, "1", &fw_key, bound, "1", "", "f", "1000", "86400000", "0",
            ])
            .unwrap()
    };
    for late in [lean_call(&past), fw_call(&past)] {
        assert!(late.starts_with("LATE\n"), "{late:?}");
    }
    assert_eq!(server.cli(&["EXISTS", &lean_key]).unwrap().trim(), "0");
    assert_eq!(server.cli(&["EXISTS", &fw_key]).unwrap().trim(), "0");
    for bound in [future.as_str(), ""] {
        assert!(!lean_call(bound).contains("LATE"));
        assert!(!fw_call(bound).contains("LATE"));
    }
    assert_eq!(server.cli(&["GET", &fw_key]).unwrap().trim(), "2");
    let tat = server.tat(&lean_key).unwrap();
    let time = server.cli(&["TIME"]).unwrap();
    let t: Vec<u64> = time.lines().map(|l| l.trim().parse().unwrap()).collect();
    let then = t[0] * 1_000_000 + t[1];
    // Two tokens taken: the TAT two seconds past the first charge, which
    // came between the two readings of the clock.
    let ahead = tat - now as f64;
    let span = (then - now) as f64;
    assert!(
        (2_000_000.0..=2_000_000.0 + span).contains(&ahead),
        "{ahead} {span}"
    );
}
