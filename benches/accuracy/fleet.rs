//! Real time on a real `redis-server`: three layers ("instances") on one
//! Redis, a seeded open-loop schedule, every answer timed on this host's
//! clock moved onto Unix time (Redis's `TIME`, on the same host).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use fleetlimit::{Config, RateLimitLayer};

use crate::score::Obs;
use crate::support::{header, request, send};

/// One request of a schedule.
#[derive(Clone, Debug)]
pub struct Req {
    /// Seconds after the start.
    pub at: f64,
    pub instance: usize,
    pub path: &'static str,
    /// The key's index; its API key is `key-<index>`.
    pub key: usize,
}

/// What one request got.
#[derive(Clone, Debug)]
pub struct Answer {
    pub req: Req,
    pub obs: Obs,
}

pub struct Fleet {
    pub layers: Vec<RateLimitLayer>,
    pub apps: Vec<Router>,
    /// When the schedule's zero is, on both clocks.
    pub start: Instant,
    pub unix0: f64,
}

impl Fleet {
    pub async fn start(cfg: impl Fn() -> Config, n: usize) -> Self {
        let mut layers = Vec::new();
        let mut apps = Vec::new();
        for _ in 0..n {
            let layer = RateLimitLayer::new(cfg()).await.expect("a layer");
            apps.push(crate::inprocess::app(layer.clone()));
            layers.push(layer);
        }
        let (start, unix0) = now_pair();
        Self {
            layers,
            apps,
            start,
            unix0,
        }
    }

    /// Seconds on Unix time of `t`.
    pub fn unix(&self, t: Instant) -> f64 {
        self.unix0 + t.saturating_duration_since(self.start).as_secs_f64()
    }

    /// Unix time now.
    pub fn now(&self) -> f64 {
        self.unix(Instant::now())
    }

    /// Sends every request at its moment (each its own task: a request
    /// held by a frozen Redis holds nobody else up).
    pub async fn replay(&self, schedule: Vec<Req>) -> Vec<Answer> {
        let mut tasks = Vec::with_capacity(schedule.len());
        let (start, unix0) = (self.start, self.unix0);
        for req in schedule {
            let app = self.apps[req.instance].clone();
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until((start + Duration::from_secs_f64(req.at)).into()).await;
                send_one(&app, req, start, unix0).await
            }));
        }
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await.expect("a request task"));
        }
        out
    }
}

/// Sends one request now and times its answer.
pub async fn send_one(app: &Router, req: Req, start: Instant, unix0: f64) -> Answer {
    let key = format!("key-{}", req.key);
    let r = request("GET", req.path, "127.0.0.1:7000", &[("x-api-key", &key)]);
    let t0 = Instant::now();
    let res = tokio::time::timeout(Duration::from_secs(10), send(app, r)).await;
    let t1 = Instant::now();
    let on = |t: Instant| unix0 + (t - start).as_secs_f64();
    let (admitted, decided) = match &res {
        Ok(res) => (
            res.status() == 200,
            header(res, "x-ratelimit-limit").is_some(),
        ),
        Err(_) => (false, false),
    };
    Answer {
        obs: Obs {
            key: req.key,
            t0: on(t0),
            t1: on(t1),
            cost: 1.0,
            admitted,
            decided,
        },
        req,
    }
}

/// This host's monotonic and Unix clocks, read together.
fn now_pair() -> (Instant, f64) {
    let i = Instant::now();
    let u = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    (i, u)
}

/// Poisson arrivals of `rate` per second on `key` of `path`, spread over
/// `instances` at random, from `from` to `to` seconds.
pub fn poisson(
    rng: &mut crate::Rng,
    rate: f64,
    (from, to): (f64, f64),
    path: &'static str,
    key: usize,
    instances: usize,
) -> Vec<Req> {
    let mut out = Vec::new();
    let mut t = from + rng.exp(1.0 / rate);
    while t < to {
        let instance = (rng.u64() % instances as u64) as usize;
        out.push(Req {
            at: t,
            instance,
            path,
            key,
        });
        t += rng.exp(1.0 / rate);
    }
    out
}

/// The answers' observations, for `score`.
pub fn observations(answers: &[Answer]) -> Vec<Obs> {
    answers.iter().map(|a| a.obs.clone()).collect()
}
