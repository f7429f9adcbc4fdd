//! Load shedding: refusing work from everyone, before any per-key limit is
//! charged, when the protected resource is saturated. Every customer can be
//! within its own limits while together they ask more than the backend (a
//! search cluster, a database) can serve; then the least important work
//! goes first.
//!
//! One number, the *pressure* (`1.0` = saturated), is the largest of:
//!
//! - this instance's requests in flight ÷ `max_in_flight`;
//! - CoDel on the queueing delay ([`codel`]): `1.0` while the shortest
//!   wait over an interval stays above target;
//! - the application's [`LoadSignal`];
//! - the fleet-wide value an operator sets in Redis ([`signal`]).
//!
//! Each route's [`Priority`] is shed from its own threshold: `sheddable`
//! from `sheddable_at` (0.8), `normal` from 1.0, `critical` from
//! `critical_at` (1.5). A shed request is answered `503` with `Retry-After`
//! and touches no store.

mod accepted;
mod codel;
mod signal;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

pub use self::accepted::{Accepted, AcceptedLayer, StampAccepted};
use self::codel::Codel;
pub use self::signal::LoadSignal;
use self::signal::{app_pressure, FleetSignal};
use crate::log_throttle::Throttle;

/// How early a route's requests are shed (`priority` in TOML): `sheddable`
/// first, `critical` last.
///
/// ```
/// use fleetlimit::{Priority, RouteConfig};
///
/// let checkout = RouteConfig::new(["per-account"]).priority(Priority::Critical);
/// let export = RouteConfig::new(Vec::<String>::new()).priority(Priority::Sheddable);
/// # let _ = (checkout, export);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Shed last, from `critical_at` (sign-in, checkout).
    Critical,
    /// Shed at saturation (pressure 1.0); the default.
    #[default]
    Normal,
    /// Shed first, from `sheddable_at` (exports, prefetches, crawlers).
    Sheddable,
}

impl Priority {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Critical => "critical",
            Self::Normal => "normal",
            Self::Sheddable => "sheddable",
        }
    }
}

/// Load-shedding settings (`[shedding]` in TOML; absent: no shedding, at no
/// cost to requests).
///
/// ```
/// use std::time::Duration;
/// use fleetlimit::{Config, SheddingConfig};
///
/// let cfg = Config::builder()
///     .shedding(SheddingConfig { max_in_flight: Some(200), ..SheddingConfig::default() })
///     .build()?;
/// # let _ = cfg;
/// # Ok::<(), fleetlimit::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SheddingConfig {
    /// Requests in flight through this instance's layer that saturate it
    /// (pressure 1.0); `None`: not a signal.
    pub max_in_flight: Option<u32>,
    /// CoDel's target queueing delay (default 5 ms).
    pub queue_delay_target: Duration,
    /// How long the queueing delay must stay above target to be overload
    /// (default 100 ms).
    pub queue_delay_interval: Duration,
    /// How often each instance reads the fleet-wide signal from Redis
    /// (default 1 s).
    pub fleet_signal_refresh: Duration,
    /// `Retry-After` of a shed request, whole seconds (default 1 s).
    pub retry_after: Duration,
    /// The pressure `sheddable` routes are shed from (default 0.8, at most 1.0).
    pub sheddable_at: f64,
    /// The pressure `critical` routes are shed from (default 1.5, at least 1.0).
    pub critical_at: f64,
}

impl Default for SheddingConfig {
    fn default() -> Self {
        Self {
            max_in_flight: None,
            queue_delay_target: Duration::from_millis(5),
            queue_delay_interval: Duration::from_millis(100),
            fleet_signal_refresh: Duration::from_secs(1),
            retry_after: Duration::from_secs(1),
            sheddable_at: 0.8,
            critical_at: 1.5,
        }
    }
}

/// Which signal set the pressure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    InFlight,
    QueueDelay,
    App,
    Fleet,
}

impl Signal {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::QueueDelay => "queue_delay",
            Self::App => "app",
            Self::Fleet => "fleet",
        }
    }
}

/// Why a request was shed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shed {
    pub(crate) priority: Priority,
    pub(crate) signal: Signal,
    pub(crate) pressure: f64,
    /// `Retry-After`, whole seconds.
    pub(crate) retry_after: u64,
}

/// One layer's shedder, shared by its clones.
pub(crate) struct Shedder {
    cfg: SheddingConfig,
    in_flight: Arc<AtomicU32>,
    codel: Mutex<Codel>,
    app: Option<Arc<dyn LoadSignal>>,
    fleet: Arc<FleetSignal>,
    retry_after: u64,
    /// One INFO line a second of shed requests.
    log: Throttle,
}

impl std::fmt::Debug for Shedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shedder")
            .field("cfg", &self.cfg)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl Shedder {
    pub(crate) fn new(cfg: SheddingConfig, app: Option<Arc<dyn LoadSignal>>) -> Self {
        Self {
            codel: Mutex::new(Codel::new(cfg.queue_delay_target, cfg.queue_delay_interval)),
            in_flight: Arc::new(AtomicU32::new(0)),
            fleet: Arc::new(FleetSignal::new(cfg.fleet_signal_refresh)),
            retry_after: cfg.retry_after.as_secs_f64().ceil().max(1.0) as u64,
            cfg,
            app,
            log: Throttle::default(),
        }
    }

    /// Starts reading the fleet-wide signal from `key` on the layer's Redis
    /// pool; the task ends when this shedder is dropped.
    pub(crate) fn start_fleet_signal(&self, pool: fred::clients::Pool, key: String) {
        signal::start(
            pool,
            Arc::downgrade(&self.fleet),
            key,
            self.cfg.fleet_signal_refresh,
        );
    }

    /// The pressure now, and the signal that set it.
    pub(crate) fn pressure(&self) -> (f64, Signal) {
        let mut worst = (0.0, Signal::InFlight);
        let mut consider = |p: f64, s: Signal| {
            if p > worst.0 {
                worst = (p, s);
            }
        };
        if let Some(max) = self.cfg.max_in_flight {
            let n = self.in_flight.load(Ordering::Relaxed);
            consider(f64::from(n) / f64::from(max), Signal::InFlight);
        }
        if self.codel_overloaded() {
            consider(1.0, Signal::QueueDelay);
        }
        if let Some(app) = &self.app {
            consider(app_pressure(app), Signal::App);
        }
        consider(self.fleet.pressure(), Signal::Fleet);
        worst
    }

    fn codel_overloaded(&self) -> bool {
        crate::sync::lock(&self.codel).overloaded(Instant::now())
    }

    fn threshold(&self, p: Priority) -> f64 {
        match p {
            Priority::Critical => self.cfg.critical_at,
            Priority::Normal => 1.0,
            Priority::Sheddable => self.cfg.sheddable_at,
        }
    }

    /// Admit a request of `priority` (counted in flight until its
    /// [`InFlight`] is dropped), or shed it.
    pub(crate) fn admit(
        self: &Arc<Self>,
        priority: Priority,
        accepted: Option<std::time::Instant>,
    ) -> Result<Ticket, Shed> {
        let (pressure, signal) = self.pressure();
        if pressure >= self.threshold(priority) {
            let shed = Shed {
                priority,
                signal,
                pressure,
                retry_after: self.retry_after,
            };
            self.log_shed(&shed);
            return Err(shed);
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(Ticket {
            shedder: Arc::clone(self),
            entered: Instant::now(),
            accepted,
            guard: InFlight(Arc::clone(&self.in_flight)),
        })
    }

    fn log_shed(&self, s: &Shed) {
        let (priority, signal) = (s.priority.as_str(), s.signal.as_str());
        match self.log.event() {
            Some(suppressed) => tracing::info!(target: "fleetlimit", priority, signal,
                pressure = s.pressure, suppressed, reason = "overloaded", "shed"),
            None => tracing::debug!(target: "fleetlimit", priority, signal,
                pressure = s.pressure, reason = "overloaded", "shed"),
        }
    }

    /// Requests in flight through this layer now.
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// An admitted request: in flight until its response is over.
#[derive(Debug)]
pub(crate) struct Ticket {
    shedder: Arc<Shedder>,
    entered: Instant,
    accepted: Option<std::time::Instant>,
    guard: InFlight,
}

impl Ticket {
    /// The handler is being called now: its queueing delay goes to CoDel,
    /// and the returned guard is held until the response is over.
    pub(crate) fn start(self) -> InFlight {
        let delay = match self.accepted {
            Some(at) => at.elapsed(),
            None => self.entered.elapsed(),
        };
        crate::sync::lock(&self.shedder.codel).sample(delay, Instant::now());
        self.guard
    }
}

/// One request in this instance's count of requests in flight.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<AtomicU32>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
