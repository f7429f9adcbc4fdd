//! A circuit breaker in front of the store.
//!
//! After `failures` consecutive failures (errors or deadline misses) the
//! breaker **opens**: for `cool_off` every check is decided by the route's
//! failure policy at once, without calling Redis, so a dead or frozen Redis
//! costs microseconds per request instead of the deadline. Then it lets up
//! to `probes` requests through (**half-open**): one success closes it, a
//! failure opens it for another cool-off. Every transition is logged, and
//! [`BreakerStats`] is there for metrics.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Where the breaker stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go to the store.
    Closed,
    /// Calls are refused at once (the failure policy decides).
    Open,
    /// A few probe calls test whether the store is back.
    HalfOpen,
}

/// Counters for metrics and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerStats {
    /// The state now.
    pub state: BreakerState,
    /// Times the breaker opened.
    pub opened: u64,
    /// Times it closed again after being open.
    pub closed: u64,
    /// Checks answered without calling the store because it was open.
    pub short_circuited: u64,
    /// Store calls that failed (errors and deadline misses).
    pub failures: u64,
}

/// Breaker settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open it.
    pub failures: u32,
    /// How long it stays open before probing.
    pub cool_off: Duration,
    /// Probe calls allowed at once while half-open.
    pub probes: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failures: 3,
            cool_off: Duration::from_millis(500),
            probes: 1,
        }
    }
}

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

/// What the breaker allows for one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Permit {
    Call,
    Probe,
    Refuse,
}

#[derive(Debug)]
pub(crate) struct Breaker {
    config: BreakerConfig,
    /// Read without the lock on the hot path.
    state: AtomicU8,
    consecutive: AtomicU32,
    inner: Mutex<Inner>,
    opened: AtomicU64,
    closed: AtomicU64,
    short_circuited: AtomicU64,
    failures: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    open_until: Option<Instant>,
    probes: u32,
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            state: AtomicU8::new(CLOSED),
            consecutive: AtomicU32::new(0),
            inner: Mutex::new(Inner {
                open_until: None,
                probes: 0,
            }),
            opened: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            short_circuited: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    pub(crate) fn permit(&self) -> Permit {
        if self.state.load(Ordering::Acquire) == CLOSED {
            return Permit::Call;
        }
        let mut inner = crate::lock(&self.inner);
        match self.state.load(Ordering::Acquire) {
            CLOSED => Permit::Call,
            OPEN if inner.open_until.is_some_and(|t| Instant::now() < t) => self.refuse(),
            OPEN | HALF_OPEN if inner.probes < self.config.probes.max(1) => {
                if self.state.swap(HALF_OPEN, Ordering::AcqRel) == OPEN {
                    tracing::info!(target: "fleetlimit", breaker = "half-open", "circuit breaker: probing the store");
                }
                inner.probes += 1;
                Permit::Probe
            }
            _ => self.refuse(),
        }
    }

    /// Holds `permit` until its call is [`recorded`](Guard::record). A call
    /// dropped before the store answered (the client went away, an outer
    /// timeout) frees its probe slot without judging the store; otherwise a
    /// half-open breaker would wait for that probe forever.
    pub(crate) fn guard(&self, permit: Permit) -> Guard<'_> {
        Guard {
            breaker: self,
            permit: Some(permit),
        }
    }

    fn refuse(&self) -> Permit {
        self.short_circuited.fetch_add(1, Ordering::Relaxed);
        Permit::Refuse
    }

    pub(crate) fn record(&self, permit: Permit, ok: bool) {
        if permit == Permit::Refuse {
            return;
        }
        if !ok {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        if ok && permit == Permit::Call && self.state.load(Ordering::Acquire) == CLOSED {
            // The hot path: no lock, and no write unless a streak is broken.
            if self.consecutive.load(Ordering::Relaxed) != 0 {
                self.consecutive.store(0, Ordering::Relaxed);
            }
            return;
        }
        let mut inner = crate::lock(&self.inner);
        if permit == Permit::Probe {
            inner.probes = inner.probes.saturating_sub(1);
        }
        if ok {
            self.consecutive.store(0, Ordering::Relaxed);
            if self.state.swap(CLOSED, Ordering::AcqRel) != CLOSED {
                inner.open_until = None;
                self.closed.fetch_add(1, Ordering::Relaxed);
                tracing::info!(target: "fleetlimit", breaker = "closed", "circuit breaker closed: the store answers again");
            }
            return;
        }
        let consecutive = self.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
        let state = self.state.load(Ordering::Acquire);
        if state == HALF_OPEN || (state == CLOSED && consecutive >= self.config.failures.max(1)) {
            inner.open_until = Some(Instant::now() + self.config.cool_off);
            self.state.store(OPEN, Ordering::Release);
            self.opened.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                target: "fleetlimit",
                breaker = "open",
                consecutive_failures = consecutive,
                cool_off_ms = self.config.cool_off.as_millis() as u64,
                "circuit breaker open: routes use their failure policy without calling the store"
            );
        }
    }

    fn abandon(&self, permit: Permit) {
        if permit == Permit::Probe {
            let mut inner = crate::lock(&self.inner);
            inner.probes = inner.probes.saturating_sub(1);
        }
    }

    pub(crate) fn stats(&self) -> BreakerStats {
        BreakerStats {
            state: match self.state.load(Ordering::Acquire) {
                CLOSED => BreakerState::Closed,
                OPEN => BreakerState::Open,
                _ => BreakerState::HalfOpen,
            },
            opened: self.opened.load(Ordering::Relaxed),
            closed: self.closed.load(Ordering::Relaxed),
            short_circuited: self.short_circuited.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
        }
    }
}

/// A permit in use; see [`Breaker::guard`].
#[derive(Debug)]
pub(crate) struct Guard<'a> {
    breaker: &'a Breaker,
    permit: Option<Permit>,
}

impl Guard<'_> {
    pub(crate) fn record(mut self, ok: bool) {
        if let Some(p) = self.permit.take() {
            self.breaker.record(p, ok);
        }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.permit.take() {
            self.breaker.abandon(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn opens_after_a_streak_probes_after_the_cool_off_and_closes() {
        let b = Breaker::new(BreakerConfig {
            failures: 3,
            cool_off: Duration::from_secs(1),
            probes: 1,
        });
        for _ in 0..2 {
            let p = b.permit();
            assert_eq!(p, Permit::Call);
            b.record(p, false);
        }
        // A success breaks the streak.
        b.record(b.permit(), true);
        for _ in 0..3 {
            let p = b.permit();
            b.record(p, false);
        }
        assert_eq!(b.stats().state, BreakerState::Open);
        assert_eq!(b.permit(), Permit::Refuse);
        tokio::time::advance(Duration::from_millis(1001)).await;
        let probe = b.permit();
        assert_eq!(probe, Permit::Probe);
        assert_eq!(b.permit(), Permit::Refuse, "one probe at a time");
        // The probe fails: open for another cool-off.
        b.record(probe, false);
        assert_eq!(b.permit(), Permit::Refuse);
        tokio::time::advance(Duration::from_millis(1001)).await;
        let probe = b.permit();
        b.record(probe, true);
        let s = b.stats();
        assert_eq!(s.state, BreakerState::Closed);
        assert_eq!((s.opened, s.closed, s.short_circuited), (2, 1, 3));
        assert_eq!(b.permit(), Permit::Call);
    }

    #[tokio::test(start_paused = true)]
    async fn an_abandoned_probe_frees_its_slot() {
        let b = Breaker::new(BreakerConfig {
            failures: 1,
            cool_off: Duration::from_secs(1),
            probes: 1,
        });
        b.record(b.permit(), false);
        tokio::time::advance(Duration::from_millis(1001)).await;
        let probe = b.guard(b.permit());
        assert_eq!(b.permit(), Permit::Refuse, "one probe at a time");
        drop(probe);
        // Not judged: still half-open, and the next caller probes.
        assert_eq!(b.stats().state, BreakerState::HalfOpen);
        let p = b.permit();
        assert_eq!(p, Permit::Probe);
        b.guard(p).record(true);
        assert_eq!(b.stats().state, BreakerState::Closed);
    }
}
