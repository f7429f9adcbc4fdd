//! Three regions for the global-limit tests (`regions.rs`,
//! `regions_hardened.rs`): three `redis-server`s, two instances in each
//! region, every exchange link (one per ordered pair of regions) through a
//! relay that adds a round trip and can be cut; and paced traffic to them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;

use super::relay::Relay;
use super::{RedisServer, ok_routes, prefix, redis_config, request, send};

pub const NAMES: [&str; 3] = ["a", "b", "c"];
/// Each instance's deadline on its Redis.
pub const DEADLINE: Duration = Duration::from_millis(250);

pub struct Fleet {
    pub servers: Vec<RedisServer>,
    /// `links[x][y]`: region x's exchange to region y (`None`: x == y).
    pub links: Vec<Vec<Option<Relay>>>,
    /// Two instances per region.
    pub apps: Vec<[Router; 2]>,
    /// Each region's two layers (their stats); [`Fleet::stop`] drops them.
    pub layers: Vec<Vec<fleetlimit::RateLimitLayer>>,
    pub prefix: String,
    /// Each region's configuration (for the admin tools), and its text.
    pub configs: Vec<fleetlimit::Config>,
    pub sources: Vec<String>,
}

impl Fleet {
    /// Quotas moved once per `interval`, each link holding a command
    /// `rtt`, and region `x`'s limit `rules[x]`: (burst, refill a second).
    /// Every route is `closed` on a Redis error.
    pub async fn start(
        test: &str,
        interval: Duration,
        rtt: Duration,
        rules: [(f64, f64); 3],
    ) -> Self {
        let servers: Vec<RedisServer> = NAMES.iter().map(|_| RedisServer::start()).collect();
        let links: Vec<Vec<Option<Relay>>> = (0..3)
            .map(|x| {
                (0..3)
                    .map(|y| (x != y).then(|| Relay::with_latency(servers[y].port, rtt)))
                    .collect()
            })
            .collect();
        let prefix = prefix(test);
        let mut apps = Vec::new();
        let mut layers = Vec::new();
        let mut configs = Vec::new();
        let mut sources = Vec::new();
        for x in 0..3 {
            let mut exchange = String::new();
            for (y, name) in NAMES.iter().enumerate() {
                let url = match &links[x][y] {
                    Some(relay) => relay.url(),
                    None => servers[x].url(),
                };
                exchange.push_str(&format!("{name} = \"{url}\"\n"));
            }
            let (burst, rate) = rules[x];
            let body = format!(
                r#"
[regions]
this = "{this}"
interval = "{interval}ms"

[regions.exchange]
{exchange}
[limits.api]
key = "header:x-api-key"
capacity = {burst}
refill = "{rate}/s"
scope = "global"

[default]
limits = ["api"]
on_redis_error = "closed"
"#,
                this = NAMES[x],
                interval = interval.as_millis(),
            );
            let deadline = format!("{}ms", DEADLINE.as_millis());
            configs.push(redis_config(&servers[x], &prefix, &deadline, &body));
            sources.push(format!(
                "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n{body}",
                servers[x].url()
            ));
            let mut two = Vec::new();
            let mut region = Vec::new();
            for _ in 0..2 {
                let cfg = redis_config(&servers[x], &prefix, &deadline, &body);
                let layer = fleetlimit::RateLimitLayer::new(cfg).await.unwrap();
                region.push(layer.clone());
                two.push(ok_routes(layer, ["/"]));
            }
            apps.push([two[0].clone(), two[1].clone()]);
            layers.push(region);
        }
        Self {
            servers,
            links,
            apps,
            layers,
            prefix,
            configs,
            sources,
        }
    }

    /// Every instance of region `x` gone (its Redis stays up): with its
    /// last layer, its exchange stops.
    pub fn stop(&mut self, x: usize) {
        self.apps[x] = [Router::new(), Router::new()];
        self.layers[x].clear();
    }

    /// Cuts every exchange link to and from region `x` (blocks while the
    /// relays let the answers under way through).
    pub fn isolate(&self, x: usize) {
        for r in self.links_of(x) {
            r.cut();
        }
    }

    pub fn heal(&self, x: usize) {
        for r in self.links_of(x) {
            r.heal();
        }
    }

    fn links_of(&self, x: usize) -> impl Iterator<Item = &Relay> {
        self.links.iter().enumerate().flat_map(move |(y, row)| {
            row.iter()
                .enumerate()
                .filter(move |(z, _)| y == x || *z == x)
                .filter_map(|(_, r)| r.as_ref())
        })
    }
}

/// One answer: its region, when it was asked and answered, its status.
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    pub region: usize,
    pub sent: Instant,
    pub at: Instant,
    pub status: u16,
}

/// Sends API key `value` to each region at `rates[x]` requests a second
/// (alternating its two instances) for `secs`, and returns every answer
/// in the order they came.
pub async fn drive(fleet: &Fleet, value: &str, rates: [f64; 3], secs: Duration) -> Vec<Answer> {
    let answers = Arc::new(Mutex::new(Vec::new()));
    drive_into(fleet, value, rates, secs, &answers).await;
    let mut v = answers.lock().unwrap().clone();
    v.sort_by_key(|a| a.at);
    v
}

/// The same, adding every answer to `answers`.
pub async fn drive_into(
    fleet: &Fleet,
    value: &str,
    rates: [f64; 3],
    secs: Duration,
    answers: &Arc<Mutex<Vec<Answer>>>,
) {
    let mut tasks = Vec::new();
    for (x, &rate) in rates.iter().enumerate() {
        if rate == 0.0 {
            continue;
        }
        let apps = fleet.apps[x].clone();
        let answers = Arc::clone(answers);
        let value = value.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            let end = Instant::now() + secs;
            let mut sent = Vec::new();
            let mut i = 0usize;
            // Bounded by `secs`.
            while Instant::now() < end {
                tick.tick().await;
                let app = apps[i % 2].clone();
                i += 1;
                let answers = Arc::clone(&answers);
                let value = value.clone();
                sent.push(tokio::spawn(async move {
                    let t = Instant::now();
                    let req = request("GET", "/", "10.0.0.1:1000", &[("x-api-key", &value)]);
                    let status = send(&app, req).await.status().as_u16();
                    let a = Answer {
                        region: x,
                        sent: t,
                        at: Instant::now(),
                        status,
                    };
                    answers.lock().unwrap().push(a);
                }));
            }
            for s in sent {
                s.await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}
