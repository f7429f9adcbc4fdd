//! Load signals from outside this instance: the application's own
//! (`LoadSignal`), read on every request, and the fleet-wide value an
//! operator sets in Redis, read by a background task every
//! `fleet_signal_refresh`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

#[cfg(feature = "redis")]
use fred::clients::Pool;
#[cfg(feature = "redis")]
use fred::interfaces::{ClientLike, KeysInterface};
#[cfg(feature = "redis")]
use fred::types::config::Options;
use tokio::time::Instant;

use crate::log_throttle::Throttle;

/// The application's load signal
/// ([`RateLimitLayerBuilder::load_signal`](crate::layer::RateLimitLayerBuilder::load_signal)
/// documents it): a trait so the shedder holds one `Arc<dyn LoadSignal>`.
pub(crate) trait LoadSignal: Send + Sync + 'static {
    /// The load now: `1.0` is saturated.
    fn load(&self) -> f64;
}

impl<F: Fn() -> f64 + Send + Sync + 'static> LoadSignal for F {
    fn load(&self) -> f64 {
        self()
    }
}

/// The fleet-wide pressure last read from Redis, and when.
#[derive(Debug)]
pub(crate) struct FleetSignal {
    /// `f64` bits.
    value: AtomicU64,
    /// Milliseconds after `born` of the last answer from Redis.
    read_at: AtomicU64,
    born: Instant,
    /// A value not refreshed for this long is forgotten (Redis down).
    stale_after: Duration,
}

/// Refreshes missed before the last value read is forgotten: one late
/// answer keeps it, an outage does not hold the fleet in shedding.
pub(crate) const STALE_AFTER_REFRESHES: u32 = 3;

impl FleetSignal {
    pub(crate) fn new(refresh: Duration) -> Self {
        Self {
            value: AtomicU64::new(0f64.to_bits()),
            read_at: AtomicU64::new(0),
            born: Instant::now(),
            stale_after: refresh * STALE_AFTER_REFRESHES,
        }
    }

    /// The pressure to apply fleet-wide (0 when none, or too old).
    pub(crate) fn pressure(&self) -> f64 {
        let v = f64::from_bits(self.value.load(Ordering::Relaxed));
        if v == 0.0 {
            return 0.0;
        }
        // The refresh task may have stored a reading taken after `now`.
        let age = self
            .millis_now()
            .saturating_sub(self.read_at.load(Ordering::Relaxed));
        if Duration::from_millis(age) > self.stale_after {
            return 0.0;
        }
        v
    }

    fn millis_now(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    fn set(&self, v: f64) {
        self.read_at.store(self.millis_now(), Ordering::Relaxed);
        self.value.store(v.to_bits(), Ordering::Relaxed);
    }
}

/// Starts the task refreshing `signal` from `key` every `refresh`; it ends
/// when `signal` is dropped with the last clone of the layer.
#[cfg(feature = "redis")]
pub(crate) fn start(pool: Pool, signal: Weak<FleetSignal>, key: String, refresh: Duration) {
    tokio::spawn(refresh_loop(pool, signal, key, refresh));
}

#[cfg(feature = "redis")]
async fn refresh_loop(pool: Pool, signal: Weak<FleetSignal>, key: String, refresh: Duration) {
    let mut tick = tokio::time::interval(refresh);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let garbage_log = Throttle::default();
    let failed_log = Throttle::default();
    let no_expiry_logged = AtomicBool::new(false);
    loop {
        tick.tick().await;
        let Some(s) = signal.upgrade() else {
            return;
        };
        // A hard bound besides fred's own timeout: a frozen Redis must not
        // hold the task past its next refresh.
        let read = tokio::time::timeout(refresh, read(&pool, &key, refresh)).await;
        match read {
            Ok(Ok(None)) => s.set(0.0),
            Ok(Ok(Some((text, pttl)))) => match parse(&text) {
                Some(v) => {
                    if pttl == -1 && !no_expiry_logged.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            target: "fleetlimit",
                            key = %key,
                            value = v,
                            "the fleet-wide shedding signal has no expiry: it is honoured until deleted; \
                             set it with an expiry (SET {key} {v} EX 600) so a forgotten one ends; logged once"
                        );
                    }
                    s.set(v);
                }
                None => {
                    if let Some(suppressed) = garbage_log.event() {
                        tracing::warn!(
                            target: "fleetlimit",
                            key = %key,
                            suppressed,
                            "the fleet-wide shedding signal is not a number >= 0; ignored"
                        );
                    }
                    s.set(0.0);
                }
            },
            Ok(Err(e)) => {
                if let Some(suppressed) = failed_log.event() {
                    tracing::debug!(target: "fleetlimit", key = %key, error = %e, suppressed,
                        "cannot read the fleet-wide shedding signal; keeping the last value for now");
                }
            }
            Err(_) => {
                if let Some(suppressed) = failed_log.event() {
                    tracing::debug!(target: "fleetlimit", key = %key, suppressed,
                        "reading the fleet-wide shedding signal timed out; keeping the last value for now");
                }
            }
        }
    }
}

/// The key's text and PTTL, `None` when it is not set.
#[cfg(feature = "redis")]
async fn read(
    pool: &Pool,
    key: &str,
    refresh: Duration,
) -> Result<Option<(String, i64)>, fred::error::Error> {
    let opts = Options {
        timeout: Some(refresh.min(Duration::from_secs(1))),
        fail_fast: true,
        max_attempts: Some(1),
        ..Options::default()
    };
    let client = pool.with_options(&opts);
    let text: Option<String> = client.get(key).await?;
    let Some(text) = text else {
        return Ok(None);
    };
    let pttl: i64 = client.pttl(key).await?;
    Ok(Some((text, pttl)))
}

/// A pressure: a finite number, at least 0.
fn parse(text: &str) -> Option<f64> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
}

/// The application's signal as a pressure (not a number: none).
pub(crate) fn app_pressure(signal: &Arc<dyn LoadSignal>) -> f64 {
    let v = signal.load();
    if v.is_nan() { 0.0 } else { v }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_numbers_from_zero_up_are_pressures() {
        assert_eq!(parse("1.2"), Some(1.2));
        assert_eq!(parse(" 0 "), Some(0.0));
        assert_eq!(parse("banana"), None);
        assert_eq!(parse("-1"), None);
        assert_eq!(parse("inf"), None);
        assert_eq!(parse("NaN"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reading_newer_than_now_is_fresh() {
        let s = FleetSignal::new(Duration::from_secs(1));
        s.set(1.2);
        // The refresh task's clock read came after this thread's: as if
        // the value were stored a moment from now.
        let later = s.millis_now() + 5;
        s.read_at.store(later, Ordering::Relaxed);
        assert_eq!(s.pressure(), 1.2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_value_not_refreshed_for_a_few_periods_is_forgotten() {
        let refresh = Duration::from_secs(1);
        let s = FleetSignal::new(refresh);
        s.set(1.2);
        tokio::time::advance(refresh * STALE_AFTER_REFRESHES).await;
        assert_eq!(s.pressure(), 1.2);
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(s.pressure(), 0.0);
    }

    // The removed `LoadSignal` example: a closure over a counter is a
    // load signal, read when asked.
    #[test]
    fn a_closure_over_a_counter_is_a_load_signal() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicU32;
        let searching = Arc::new(AtomicU32::new(0));
        let seen = Arc::clone(&searching);
        let signal: Arc<dyn LoadSignal> =
            Arc::new(move || f64::from(seen.load(Ordering::Relaxed)) / 64.0);
        assert_eq!(signal.load(), 0.0);
        searching.store(48, Ordering::Relaxed);
        assert_eq!(signal.load(), 0.75);
    }
}
