//! The contenders (bare axum, fleetlimit on memory and on Redis,
//! tower-rate-limit-fred, tower_governor): their apps, each served on a
//! runtime with one worker thread.

use std::fmt::Write as _;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use axum::serve::ListenerExt;
use fleetlimit::{Config, RateLimitLayer};
use http::{HeaderValue, Request};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;
use tower_governor::{GovernorError, GovernorLayer};

use crate::knobs::{DEADLINE_MS, POOL_SIZE, X_API_KEY};
use crate::peer;

/// One limit's numbers: a token bucket of `capacity` refilled at
/// `refill_per_sec`; for GCRA (the peer, governor) a burst of `capacity`
/// and one request per `1 / refill_per_sec` seconds: the same limit.
#[derive(Clone, Copy, Debug)]
pub struct Numbers {
    pub capacity: u16,
    pub refill_per_sec: u32,
}

impl Numbers {
    pub fn emission_interval(self) -> Duration {
        Duration::from_secs_f64(1.0 / f64::from(self.refill_per_sec))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contender {
    Bare,
    FleetMemory,
    FleetRedis {
        label: &'static str,
        on_redis_error: &'static str,
        deadline: &'static str,
        /// Hot-key leases (`lease_batch = LEASE_BATCH`).
        lease: bool,
        /// A concurrency limit instead of the token bucket (see
        /// `fleet_config`).
        in_flight: bool,
        /// `[redis] batch_window`.
        batch_window: Option<&'static str>,
    },
    Peer,
    Governor,
}

pub const BARE: Contender = Contender::Bare;
pub const FLEET_MEMORY: Contender = Contender::FleetMemory;
pub const FLEET_REDIS: Contender = Contender::FleetRedis {
    label: "fleetlimit (Redis)",
    on_redis_error: "open",
    deadline: "50ms",
    lease: false,
    in_flight: false,
    batch_window: None,
};
pub const FLEET_REDIS_LEASE: Contender = Contender::FleetRedis {
    label: "fleetlimit (Redis, leases)",
    on_redis_error: "open",
    deadline: "50ms",
    lease: true,
    in_flight: false,
    batch_window: None,
};
pub const FLEET_REDIS_IN_FLIGHT: Contender = Contender::FleetRedis {
    label: "fleetlimit (Redis, concurrency)",
    on_redis_error: "open",
    deadline: "50ms",
    lease: false,
    in_flight: true,
    batch_window: None,
};
/// Coalesced checks wait 0.5 ms for company (`[redis] batch_window`).
pub const FLEET_REDIS_W05: Contender = Contender::FleetRedis {
    label: "fleetlimit (Redis, batch window 0.5 ms)",
    on_redis_error: "open",
    deadline: "50ms",
    lease: false,
    in_flight: false,
    batch_window: Some("0.5ms"),
};
/// Coalesced checks wait 1 ms for company.
pub const FLEET_REDIS_W1: Contender = Contender::FleetRedis {
    label: "fleetlimit (Redis, batch window 1 ms)",
    on_redis_error: "open",
    deadline: "50ms",
    lease: false,
    in_flight: false,
    batch_window: Some("1ms"),
};
/// Tokens per lease in the hot-key scenario.
pub const LEASE_BATCH: u32 = 50;
pub const PEER: Contender = Contender::Peer;
pub const GOVERNOR: Contender = Contender::Governor;
pub const FROZEN_LOCAL: Contender = Contender::FleetRedis {
    label: "fleetlimit (Redis frozen, local)",
    on_redis_error: "local",
    deadline: "5ms",
    lease: false,
    in_flight: false,
    batch_window: None,
};
pub const FROZEN_OPEN: Contender = Contender::FleetRedis {
    label: "fleetlimit (Redis frozen, open)",
    on_redis_error: "open",
    deadline: "5ms",
    lease: false,
    in_flight: false,
    batch_window: None,
};

impl Contender {
    pub fn name(self) -> &'static str {
        match self {
            Contender::Bare => "bare axum",
            Contender::FleetMemory => "fleetlimit (memory)",
            Contender::FleetRedis { label, .. } => label,
            Contender::Peer => "tower-rate-limit-fred",
            Contender::Governor => "tower_governor",
        }
    }

    pub fn uses_redis(self) -> bool {
        matches!(self, Contender::FleetRedis { .. } | Contender::Peer)
    }
}

// The server side: one contender on a runtime with one worker thread.

/// The contender's server on its own thread; stopped (and joined) when
/// dropped.
pub struct Server {
    pub addr: SocketAddr,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub thread: Option<JoinHandle<String>>,
}

impl Server {
    pub fn start(c: Contender, numbers: Numbers, redis_url: String) -> Self {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("load-server".into())
            .spawn(move || serve(c, numbers, &redis_url, &ready_tx, stop_rx))
            .expect("a server thread");
        let addr = ready_rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("the {} server did not start: {e}", c.name()));
        Self {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// Stops the server; returns what it had to say about the run.
    pub fn stop(mut self) -> String {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.thread
            .take()
            .map(|t| t.join().expect("the server thread panicked"))
            .unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub type Probe = Box<dyn FnOnce() -> String + Send>;

/// Builds the contender's app inside a runtime with one worker thread (so
/// its Redis pool's connection tasks run on that worker too), serves it
/// until told to stop, and returns the contender's note.
pub fn serve(
    c: Contender,
    numbers: Numbers,
    redis_url: &str,
    ready: &mpsc::Sender<SocketAddr>,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> String {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("load-server-worker")
        .enable_all()
        .build()
        .expect("a server runtime");
    let note = rt.block_on(async move {
        let (app, probe) = build_app(c, numbers, redis_url).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("a local address");
        // The same for every contender: responses are one write anyway.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let server = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        );
        // Spawned, so that accepting runs on the worker thread too.
        let task = tokio::spawn(server.into_future());
        let _ = ready.send(addr);
        tokio::select! {
            _ = stop => {}
            r = task => panic!("the {} server stopped by itself: {r:?}", c.name()),
        }
        probe.map(|p| p()).unwrap_or_default()
    });
    // Connection tasks still alive (none should be) are dropped here.
    rt.shutdown_timeout(Duration::from_secs(1));
    note
}

pub fn router() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

/// fleetlimit's configuration: one token-bucket limit keyed by the
/// `x-api-key` header on route `/`, Redis settings when `redis` is given
/// (the URL is set with `try_with_redis_url`). `in_flight`: the route's limit
/// is a concurrency limit of `capacity` slots per key instead (one slot
/// taken per request, given back when its response ends).
pub fn fleet_config(
    numbers: Numbers,
    redis: Option<(&str, &str, Option<&str>)>,
    lease: bool,
    in_flight: bool,
) -> Config {
    let mut toml = String::new();
    let mut on_redis_error = "open";
    if let Some((deadline, policy, window)) = redis {
        on_redis_error = policy;
        let _ = write!(
            toml,
            "[redis]\npool_size = {POOL_SIZE}\ndeadline = \"{deadline}\"\n"
        );
        if let Some(w) = window {
            let _ = writeln!(toml, "batch_window = \"{w}\"");
        }
        toml.push('\n');
    }
    let _ = write!(
        toml,
        r#"[limits.per-key]
key = "header:x-api-key"
algorithm = "token-bucket"
capacity = {capacity}
refill = "{refill}/s"
{lease}

[limits.in-flight]
key = "header:x-api-key"
algorithm = "concurrency"
max_in_flight = {capacity}
max_hold = "60s"

[[routes]]
path = "/"
limits = ["{limit}"]
on_redis_error = "{on_redis_error}"
"#,
        limit = if in_flight { "in-flight" } else { "per-key" },
        capacity = numbers.capacity,
        refill = numbers.refill_per_sec,
        lease = if lease {
            format!("lease_batch = {LEASE_BATCH}")
        } else {
            String::new()
        },
    );
    Config::from_toml_str(&toml).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

pub async fn build_app(c: Contender, numbers: Numbers, redis_url: &str) -> (Router, Option<Probe>) {
    match c {
        Contender::Bare => (router(), None),
        Contender::FleetMemory => (
            router().layer(
                RateLimitLayer::new(fleet_config(numbers, None, false, false))
                    .await
                    .expect("fleetlimit's in-process layer"),
            ),
            None,
        ),
        Contender::FleetRedis {
            on_redis_error,
            deadline,
            lease,
            in_flight,
            batch_window,
            ..
        } => {
            let redis = Some((deadline, on_redis_error, batch_window));
            let cfg = fleet_config(numbers, redis, lease, in_flight)
                .try_with_redis_url(redis_url)
                .expect("the load bench's Redis URL");
            let layer = RateLimitLayer::new(cfg)
                .await
                .expect("fleetlimit's Redis layer");
            let probe_layer = layer.clone();
            let probe: Probe = Box::new(move || {
                let s = probe_layer.stats();
                match (
                    s.breaker_opened(),
                    s.breaker_short_circuited(),
                    s.breaker_failures(),
                ) {
                    (Some(opened), Some(short_circuited), Some(failures)) => format!(
                        "breaker opened {opened}×, {short_circuited} checks short-circuited, {failures} failed"
                    ),
                    _ => String::new(),
                }
            });
            (router().layer(layer), Some(probe))
        }
        Contender::Peer => {
            let timeout = Duration::from_millis(DEADLINE_MS);
            let (capacity, emission) = (numbers.capacity, numbers.emission_interval());
            let layer = peer::layer(redis_url, POOL_SIZE, timeout, capacity, emission, true).await;
            (router().layer(layer), None)
        }
        Contender::Governor => {
            let config = GovernorConfigBuilder::default()
                .key_extractor(GovernorKey)
                .period(numbers.emission_interval())
                .burst_size(u32::from(numbers.capacity))
                .finish()
                .expect("a governor configuration");
            (router().layer(GovernorLayer::new(config)), None)
        }
    }
}

/// governor's key: the `x-api-key` header.
#[derive(Clone, Copy, Debug)]
pub struct GovernorKey;

impl KeyExtractor for GovernorKey {
    type Key = HeaderValue;

    fn extract<T>(&self, req: &Request<T>) -> Result<HeaderValue, GovernorError> {
        req.headers()
            .get(&X_API_KEY)
            .cloned()
            .ok_or(GovernorError::UnableToExtractKey)
    }
}
