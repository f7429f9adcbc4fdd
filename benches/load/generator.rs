//! The load generator: like `wrk -t1 -c64`, one current-thread runtime;
//! the API keys it sends and the generator's own rng. Closed loop here
//! (each connection sends back to back); the fixed-rate connection is in
//! openloop.rs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::HOST;
use http::{HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use crate::cpu::thread_self_cpu_ns;
use crate::knobs::{
    ABUSE_PERCENT, ABUSERS, CONNECTIONS, NORMAL_KEYS, OPEN_LOOP_INTERVAL,
    OPEN_LOOP_MAX_CONNECTIONS, REQUEST_TIMEOUT, X_API_KEY,
};
use crate::openloop::paced_connection;

/// How the generator sends: `connections` keep-alive connections, back to
/// back (closed loop) or at a fixed total rate (open loop).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Load {
    pub connections: usize,
    /// Requests per second over all connections; `None`: closed loop.
    pub rate: Option<f64>,
}

/// The closed loop of the scenarios: `CONNECTIONS` connections.
pub const CLOSED: Load = Load {
    connections: CONNECTIONS,
    rate: None,
};

impl Load {
    pub const fn closed(connections: usize) -> Self {
        Self {
            connections,
            rate: None,
        }
    }

    /// `rate` req/s in total, on enough connections that each sends at
    /// most once per `OPEN_LOOP_INTERVAL`.
    pub fn open(rate: f64) -> Self {
        let needed = (rate * OPEN_LOOP_INTERVAL.as_secs_f64()).ceil() as usize;
        Self {
            connections: needed.clamp(CONNECTIONS, OPEN_LOOP_MAX_CONNECTIONS),
            rate: Some(rate),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Traffic {
    /// Uniform over the normal keys.
    Normal,
    /// `ABUSE_PERCENT` % from the abusers, the rest over the normal keys.
    Abuse,
    /// Every request on one hot key.
    Hot,
}

#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Recorded requests' latencies, µs.
    pub latencies_us: Vec<u32>,
    pub ok: u64,
    pub limited: u64,
    /// Any other status.
    pub other: u64,
    /// Transport errors and timeouts.
    pub errors: u64,
    /// CPU time of the generator's thread while recording.
    pub cpu_ns: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub requests: u64,
    pub rps: f64,
    pub p50_us: u32,
    pub p90_us: u32,
    pub p99_us: u32,
    pub p999_us: u32,
    pub share_429: f64,
    pub other: u64,
    pub errors: u64,
}

impl Tally {
    pub fn record(&mut self, status: StatusCode, latency: Duration) {
        let us = u32::try_from(latency.as_micros()).unwrap_or(u32::MAX);
        self.latencies_us.push(us);
        match status {
            StatusCode::OK => self.ok += 1,
            StatusCode::TOO_MANY_REQUESTS => self.limited += 1,
            _ => self.other += 1,
        }
    }

    pub fn merge(&mut self, other: Tally) {
        self.latencies_us.extend(other.latencies_us);
        self.ok += other.ok;
        self.limited += other.limited;
        self.other += other.other;
        self.errors += other.errors;
    }

    pub fn stats(mut self, secs: Duration) -> Stats {
        self.latencies_us.sort_unstable();
        let n = self.latencies_us.len();
        let pct = |p: f64| -> u32 {
            if n == 0 {
                return 0;
            }
            // Nearest rank.
            let rank = ((p * n as f64).ceil() as usize).clamp(1, n);
            self.latencies_us[rank - 1]
        };
        let answered = self.ok + self.limited + self.other;
        Stats {
            requests: answered,
            rps: answered as f64 / secs.as_secs_f64(),
            p50_us: pct(0.50),
            p90_us: pct(0.90),
            p99_us: pct(0.99),
            p999_us: pct(0.999),
            share_429: if answered == 0 {
                0.0
            } else {
                self.limited as f64 / answered as f64
            },
            other: self.other,
            errors: self.errors,
        }
    }
}

pub struct Keys {
    pub normal: Vec<HeaderValue>,
    pub abusers: Vec<HeaderValue>,
    pub hot: HeaderValue,
}

impl Keys {
    pub fn new() -> Self {
        let header = |s: String| HeaderValue::from_str(&s).expect("an ASCII key");
        Self {
            normal: (0..NORMAL_KEYS)
                .map(|i| header(format!("key-{i:05}")))
                .collect(),
            abusers: (0..ABUSERS)
                .map(|i| header(format!("abuser-{i:02}")))
                .collect(),
            hot: header("hot-key".to_owned()),
        }
    }

    pub fn pick(&self, traffic: Traffic, rng: &mut Rng) -> &HeaderValue {
        match traffic {
            Traffic::Normal => &self.normal[rng.below(NORMAL_KEYS)],
            Traffic::Hot => &self.hot,
            Traffic::Abuse => {
                if (rng.below(100) as u64) < ABUSE_PERCENT {
                    &self.abusers[rng.below(ABUSERS)]
                } else {
                    &self.normal[rng.below(NORMAL_KEYS)]
                }
            }
        }
    }
}

/// xorshift64*, seeded through splitmix64: cheap and reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (((x >> 32) * n as u64) >> 32) as usize
    }
}

/// Starts the load on its own thread: requests from `warm` to `end` are
/// recorded; every connection stops at `end` (each request is bounded by
/// `REQUEST_TIMEOUT`). Connection `i` goes to `addrs[i % addrs.len()]`.
pub fn spawn_generator(
    addrs: Vec<SocketAddr>,
    traffic: Traffic,
    load: Load,
    warm: Instant,
    end: Instant,
    seed: u64,
) -> JoinHandle<Tally> {
    assert!(!addrs.is_empty(), "no server to load");
    std::thread::Builder::new()
        .name("load-generator".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a generator runtime");
            rt.block_on(async move {
                let keys = Arc::new(Keys::new());
                let start = Instant::now();
                let tasks: Vec<_> = (0..load.connections)
                    .map(|i| {
                        let addr = addrs[i % addrs.len()];
                        let keys = Arc::clone(&keys);
                        let seed = seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
                        match load.rate {
                            None => tokio::spawn(connection(addr, keys, traffic, seed, warm, end)),
                            Some(rate) => {
                                // Connection i sends every `connections / rate`
                                // seconds, the connections evenly staggered.
                                let every = Duration::from_secs_f64(load.connections as f64 / rate);
                                let first =
                                    start + every.mul_f64(i as f64 / load.connections as f64);
                                let pace = (first, every);
                                tokio::spawn(paced_connection(
                                    addr, keys, traffic, seed, pace, warm, end,
                                ))
                            }
                        }
                    })
                    .collect();
                // This thread's CPU time over the recorded seconds (read
                // here: the thread is gone by the time the harness could).
                tokio::time::sleep_until(warm.into()).await;
                let cpu_before = thread_self_cpu_ns();
                let mut total = Tally::default();
                for t in tasks {
                    total.merge(t.await.expect("a connection task panicked"));
                }
                total.cpu_ns = cpu_before
                    .zip(thread_self_cpu_ns())
                    .map(|(a, b)| b.saturating_sub(a));
                total
            })
        })
        .expect("a generator thread")
}

pub async fn connect(addr: SocketAddr) -> Option<SendRequest<Empty<Bytes>>> {
    let stream = tokio::time::timeout(REQUEST_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Some(sender)
}

/// `GET /` with the `x-api-key` header.
pub fn request(host: &HeaderValue, key: &HeaderValue) -> Request<Empty<Bytes>> {
    let mut req = Request::new(Empty::<Bytes>::new());
    req.headers_mut().insert(HOST, host.clone());
    req.headers_mut().insert(X_API_KEY.clone(), key.clone());
    req
}

pub async fn exchange(
    sender: &mut SendRequest<Empty<Bytes>>,
    req: Request<Empty<Bytes>>,
) -> Result<StatusCode, hyper::Error> {
    sender.ready().await?;
    let res = sender.send_request(req).await?;
    let status = res.status();
    res.into_body().collect().await?;
    Ok(status)
}

/// One keep-alive connection sending requests back to back until `end`.
pub async fn connection(
    addr: SocketAddr,
    keys: Arc<Keys>,
    traffic: Traffic,
    seed: u64,
    warm: Instant,
    end: Instant,
) -> Tally {
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    let host = HeaderValue::from_str(&addr.to_string()).expect("an address");
    let mut sender = None;
    while Instant::now() < end {
        let mut s = match sender.take() {
            Some(s) => s,
            None => match connect(addr).await {
                Some(s) => s,
                None => {
                    if Instant::now() >= warm {
                        tally.errors += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let req = request(&host, keys.pick(traffic, &mut rng));
        let started = Instant::now();
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, exchange(&mut s, req)).await;
        let done = Instant::now();
        let recorded = started >= warm && done <= end;
        match outcome {
            Ok(Ok(status)) => {
                sender = Some(s);
                if recorded {
                    tally.record(status, done.duration_since(started));
                }
            }
            // The connection is dropped and replaced.
            _ => {
                if started >= warm {
                    tally.errors += 1;
                }
            }
        }
    }
    tally
}
