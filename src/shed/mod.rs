//! Load shedding: refusing work from everyone, before any per-key limit is
//! charged, when the protected resource is saturated. Every customer can be
//! within its own limits while together they ask more than the backend (a
//! search cluster, a database) can serve; then the least important work
//! goes first.
//!
//! One number, the *pressure* (`1.0` = saturated), is the largest of:
//!
//! - this instance's requests in flight ÷ `max_in_flight`;
//! - CoDel on the queueing delay (`codel.rs`): `1.0` while the shortest
//!   wait over an interval stays above target;
//! - the application's load signal
//!   ([`RateLimitLayerBuilder::load_signal`](crate::layer::RateLimitLayerBuilder::load_signal));
//! - the fleet-wide value an operator sets in Redis (`signal.rs`).
//!
//! Each route's [`Priority`] is shed from its own threshold: `sheddable`
//! from `sheddable_at` (0.8), `normal` from 1.0, `critical` from
//! `critical_at` (1.5). A shed request is answered `503` with `Retry-After`
//! and touches no store.

mod accepted;
mod codel;
mod signal;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

pub use self::accepted::{Accepted, StampAccepted};
use self::codel::Codel;
pub(crate) use self::signal::LoadSignal;
use self::signal::{FleetSignal, app_pressure};
use crate::log_throttle::Throttle;

/// How early a route's requests are shed (`priority` in TOML): `sheddable`
/// first, `critical` last.
///
/// ```
/// use fleetlimit::configuration::RouteConfig;
/// use fleetlimit::shed::Priority;
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
/// cost to requests), checked when the configuration is built.
///
/// ```
/// use fleetlimit::shed::SheddingConfig;
/// use fleetlimit::Config;
///
/// let cfg = Config::builder()
///     .shedding(SheddingConfig::default().max_in_flight(200))
///     .build()?;
/// # let _ = cfg;
/// # Ok::<(), fleetlimit::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SheddingConfig {
    /// Requests in flight through this instance's layer that saturate it
    /// (pressure 1.0); `None`: not a signal.
    pub(crate) max_in_flight: Option<u32>,
    /// CoDel's target queueing delay (default 5 ms): the wait in front of
    /// the layer, since [`Accepted`] (wrap the router in [`StampAccepted`];
    /// without it there is no queueing-delay signal).
    #[serde(deserialize_with = "crate::config::de::duration")]
    pub(crate) queue_delay_target: Duration,
    /// How long the queueing delay must stay above target to be overload
    /// (default 100 ms).
    #[serde(deserialize_with = "crate::config::de::duration")]
    pub(crate) queue_delay_interval: Duration,
    /// How often each instance reads the fleet-wide signal from Redis
    /// (default 1 s).
    #[serde(deserialize_with = "crate::config::de::duration")]
    pub(crate) fleet_signal_refresh: Duration,
    /// `Retry-After` of a shed request, whole seconds (default 1 s).
    #[serde(deserialize_with = "crate::config::de::duration")]
    pub(crate) retry_after: Duration,
    /// The pressure `sheddable` routes are shed from (default 0.8, at most 1.0).
    pub(crate) sheddable_at: f64,
    /// The pressure `critical` routes are shed from (default 1.5, at least 1.0).
    pub(crate) critical_at: f64,
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

impl SheddingConfig {
    /// Requests in flight through this instance's layer that saturate it
    /// (pressure 1.0); unset: not a signal.
    pub fn max_in_flight(mut self, requests: u32) -> Self {
        self.max_in_flight = Some(requests);
        self
    }

    /// CoDel's target queueing delay (default 5 ms): the wait in front of
    /// the layer, since [`Accepted`] (wrap the router in [`StampAccepted`];
    /// without it there is no queueing-delay signal).
    pub fn queue_delay_target(mut self, target: Duration) -> Self {
        self.queue_delay_target = target;
        self
    }

    /// How long the queueing delay must stay above target to be overload
    /// (default 100 ms).
    pub fn queue_delay_interval(mut self, interval: Duration) -> Self {
        self.queue_delay_interval = interval;
        self
    }

    /// How often each instance reads the fleet-wide signal from Redis
    /// (default 1 s).
    pub fn fleet_signal_refresh(mut self, every: Duration) -> Self {
        self.fleet_signal_refresh = every;
        self
    }

    /// `Retry-After` of a shed request, whole seconds (default 1 s).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = after;
        self
    }

    /// The pressure `sheddable` routes are shed from (default 0.8, at most
    /// 1.0).
    pub fn sheddable_at(mut self, pressure: f64) -> Self {
        self.sheddable_at = pressure;
        self
    }

    /// The pressure `critical` routes are shed from (default 1.5, at least
    /// 1.0).
    pub fn critical_at(mut self, pressure: f64) -> Self {
        self.critical_at = pressure;
        self
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
    codel: Codel,
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
            codel: Codel::new(cfg.queue_delay_target, cfg.queue_delay_interval),
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
    #[cfg(feature = "redis")]
    pub(crate) fn start_fleet_signal(&self, pool: fred::clients::Pool, key: String) {
        signal::start(
            pool,
            Arc::downgrade(&self.fleet),
            key,
            self.cfg.fleet_signal_refresh,
        );
    }

    /// Admit a request of `priority` (counted in flight until its
    /// [`Ticket`] is dropped), or shed it.
    ///
    /// `accepted`: when the request was accepted (see [`Accepted`]); its
    /// wait since then, in front of the layer, is CoDel's sample. Nothing
    /// the limiter itself does (a Redis round trip, a plan lookup, an
    /// `on_exceed = "delay"` hold) comes after it, so none of that can read
    /// as a queue. Without it there is no queueing-delay sample.
    ///
    /// `held`: this layer's requests held on purpose now (`on_exceed =
    /// "delay"`): in flight, but not in the handler, so not pressure.
    pub(crate) fn admit(
        &self,
        priority: Priority,
        accepted: Option<std::time::Instant>,
        held: u32,
    ) -> Result<Ticket, Shed> {
        let threshold = self.threshold(priority);
        let (mut pressure, mut signal) = self.outside_pressure(accepted.map(|at| at.elapsed()));
        if pressure < threshold {
            match self.cfg.max_in_flight {
                None => {
                    self.in_flight.fetch_add(1, Ordering::Relaxed);
                    return Ok(self.ticket());
                }
                Some(max) => match self.enter(max, held, threshold) {
                    Ok(()) => return Ok(self.ticket()),
                    Err(p) => (pressure, signal) = (p, Signal::InFlight),
                },
            }
        } else if let Some(max) = self.cfg.max_in_flight {
            // Shed anyway: name the worst signal.
            let p = in_flight_pressure(self.in_flight.load(Ordering::Relaxed), held, max);
            if p > pressure {
                (pressure, signal) = (p, Signal::InFlight);
            }
        }
        let shed = Shed {
            priority,
            signal,
            pressure,
            retry_after: self.retry_after,
        };
        self.log_shed(&shed);
        Err(shed)
    }

    /// The largest pressure of the signals other than in flight, and which
    /// one it is; `queued` (the request's wait in front of the layer) is
    /// CoDel's sample first.
    fn outside_pressure(&self, queued: Option<Duration>) -> (f64, Signal) {
        let mut worst = (0.0, Signal::QueueDelay);
        let mut consider = |p: f64, s: Signal| {
            if p > worst.0 {
                worst = (p, s);
            }
        };
        if self.codel_overloaded(queued) {
            consider(1.0, Signal::QueueDelay);
        }
        if let Some(app) = &self.app {
            consider(app_pressure(app), Signal::App);
        }
        consider(self.fleet.pressure(), Signal::Fleet);
        worst
    }

    /// Counts the request in flight unless that pressure has reached
    /// `threshold` (`Err`: the pressure). Check and count are one atomic
    /// step, so a burst cannot overshoot: at most ⌈`threshold` ×
    /// `max`⌉ requests besides the `held` ones are ever admitted at once.
    fn enter(&self, max: u32, held: u32, threshold: f64) -> Result<(), f64> {
        let mut n = self.in_flight.load(Ordering::Relaxed);
        loop {
            let p = in_flight_pressure(n, held, max);
            if p >= threshold {
                return Err(p);
            }
            match self.in_flight.compare_exchange_weak(
                n,
                n + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => n = now,
            }
        }
    }

    fn ticket(&self) -> Ticket {
        Ticket(Arc::clone(&self.in_flight))
    }

    /// Samples `queued` (if any) and says whether CoDel finds a standing
    /// queue; no lock, and no clock read when there is neither a sample
    /// nor an overload to check.
    fn codel_overloaded(&self, queued: Option<Duration>) -> bool {
        if queued.is_none() && !self.codel.may_be_overloaded() {
            return false;
        }
        let now = Instant::now();
        if let Some(delay) = queued {
            self.codel.sample(delay, now);
        }
        self.codel.overloaded(now)
    }

    fn threshold(&self, p: Priority) -> f64 {
        match p {
            Priority::Critical => self.cfg.critical_at,
            Priority::Normal => 1.0,
            Priority::Sheddable => self.cfg.sheddable_at,
        }
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

/// An admitted request's place in this instance's count of requests in
/// flight, given back when dropped (with its response).
#[derive(Debug)]
pub(crate) struct Ticket(Arc<AtomicU32>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `n` requests in flight, `held` of them held on purpose, against `max`.
fn in_flight_pressure(n: u32, held: u32, max: u32) -> f64 {
    f64::from(n.saturating_sub(held)) / f64::from(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shedder(max_in_flight: Option<u32>) -> Shedder {
        Shedder::new(
            SheddingConfig {
                max_in_flight,
                ..SheddingConfig::default()
            },
            None,
        )
    }

    #[test]
    fn held_requests_are_not_pressure() {
        let s = shedder(Some(4));
        let tickets: Vec<_> = (0..4)
            .map(|_| s.admit(Priority::Normal, None, 0).unwrap())
            .collect();
        let shed = s.admit(Priority::Normal, None, 0).unwrap_err();
        assert_eq!((shed.signal, shed.pressure), (Signal::InFlight, 1.0));
        // The same 4, all parked by `on_exceed = "delay"`: nothing in the
        // handlers, room for 4 more.
        let more: Vec<_> = (0..4)
            .map(|_| s.admit(Priority::Normal, None, 4).unwrap())
            .collect();
        assert!(s.admit(Priority::Normal, None, 4).is_err());
        drop((tickets, more));
        assert_eq!(s.in_flight(), 0);
    }

    #[test]
    fn a_burst_never_overshoots_max_in_flight() {
        const THREADS: usize = 4;
        let s = shedder(Some(3));
        let peak = AtomicU32::new(0);
        std::thread::scope(|scope| {
            for _ in 0..THREADS {
                scope.spawn(|| {
                    for _ in 0..500_000 {
                        if let Ok(t) = s.admit(Priority::Normal, None, 0) {
                            peak.fetch_max(s.in_flight(), Ordering::Relaxed);
                            drop(t);
                        }
                    }
                });
            }
        });
        let peak = peak.into_inner();
        assert!(peak <= 3, "{peak} in flight at once, max_in_flight 3");
        assert_eq!(s.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_before_the_layer_is_the_queueing_delay_and_nothing_after() {
        let s = shedder(None);
        let interval = SheddingConfig::default().queue_delay_interval;
        let target = SheddingConfig::default().queue_delay_target;
        // Whatever happens after `admit` (a frozen Redis, a delay) does
        // not count: requests without `Accepted` are never a sample.
        for _ in 0..30 {
            let t = s.admit(Priority::Normal, None, 0).unwrap();
            tokio::time::advance(interval / 10).await;
            drop(t);
        }
        // Waited 10 × target in front of the layer, for over an interval.
        let queued = || Some(std::time::Instant::now() - target * 10);
        for _ in 0..12 {
            let _ = s.admit(Priority::Critical, queued(), 0).unwrap();
            tokio::time::advance(interval / 10).await;
        }
        let shed = s.admit(Priority::Normal, queued(), 0).unwrap_err();
        assert_eq!((shed.signal, shed.pressure), (Signal::QueueDelay, 1.0));
        // A request that did not wait ends it, itself included.
        assert!(
            s.admit(Priority::Normal, Some(std::time::Instant::now()), 0)
                .is_ok()
        );
    }
}
