//! A circuit breaker in front of the store.
//!
//! The breaker **opens** on a *sustained* failure, never on one coincident
//! burst:
//!
//! - checks have failed (errors or deadline misses) for at least `window`
//!   with no success in between, and at least `failures` of them; the time
//!   is that of the answers, so the checks of one stall (a busy host, a
//!   blip), which all fail at the same moment, span no time and cannot
//!   open it;
//! - or `failures` *definite* errors in a row (connection refused, not
//!   connected, an error reply): Redis said so, no timing involved.
//!
//! Open, for `cool_off` every check is decided by the route's failure
//! policy at once, without calling Redis, so a dead or frozen Redis costs
//! microseconds per request instead of the deadline. Then it lets up to
//! `probes` requests through (**half-open**): one success closes it, a
//! failure opens it for another cool-off. Every transition is logged, and
//! [`BreakerStats`] is there for metrics.
//!
//! On a Redis Cluster each primary (slot owner) has its own breaker
//! ([`Breakers`]): a dead primary's failures open its breaker only, and
//! keys owned by the healthy primaries keep being decided by Redis.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use smallvec::SmallVec;
use tokio::time::Instant;

use crate::config::BreakerConfig;
use crate::store::StoreError;

/// Where the breaker stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BreakerState {
    /// Calls go to the store.
    Closed,
    /// Calls are refused at once (the failure policy decides).
    Open,
    /// A few probe calls test whether the store is back.
    HalfOpen,
}

/// Counters for metrics and tests (public as [`Stats`](crate::layer::Stats)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BreakerStats {
    /// The state now.
    pub(crate) state: BreakerState,
    /// Times the breaker opened.
    pub(crate) opened: u64,
    /// Times it closed again after being open.
    pub(crate) closed: u64,
    /// Checks answered without calling the store because it was open.
    pub(crate) short_circuited: u64,
    /// Store calls that failed (errors and deadline misses).
    pub(crate) failures: u64,
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

/// The failure streak since the last success, in one word so that a
/// success clears it with one store and a failure updates it with one
/// compare-and-swap: bits 24.. the first failure's time (ms since the
/// breaker's start, plus one), bits 12..24 the failures, bits 0..12 the
/// definite errors in a row (both saturating). Zero: no streak.
const COUNT_BITS: u32 = 12;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;

fn streak_parts(word: u64) -> (u64, u64, u64) {
    (
        word >> (2 * COUNT_BITS),
        (word >> COUNT_BITS) & COUNT_MAX,
        word & COUNT_MAX,
    )
}

#[derive(Debug)]
pub(crate) struct Breaker {
    config: BreakerConfig,
    /// The time base of `streak`.
    born: Instant,
    /// Read without the lock on the hot path.
    state: AtomicU8,
    streak: AtomicU64,
    inner: Mutex<Inner>,
    opened: AtomicU64,
    closed: AtomicU64,
    short_circuited: AtomicU64,
    failures: AtomicU64,
    /// Its state gauges and transition counters (feature `metrics`).
    metrics: crate::metrics::BreakerMetrics,
}

#[derive(Debug)]
struct Inner {
    open_until: Option<Instant>,
    probes: u32,
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig) -> Self {
        Self::named(config, "store")
    }

    /// A breaker whose metrics say `node` (`store`, or a cluster primary).
    fn named(config: BreakerConfig, node: &str) -> Self {
        Self {
            metrics: crate::metrics::BreakerMetrics::new(node),
            config,
            born: Instant::now(),
            state: AtomicU8::new(CLOSED),
            streak: AtomicU64::new(0),
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
        let mut inner = crate::sync::lock(&self.inner);
        match self.state.load(Ordering::Acquire) {
            CLOSED => Permit::Call,
            OPEN if inner.open_until.is_some_and(|t| Instant::now() < t) => self.refuse(),
            OPEN | HALF_OPEN if inner.probes < self.config.probes.max(1) => {
                if self.state.swap(HALF_OPEN, Ordering::AcqRel) == OPEN {
                    self.metrics.entered(HALF_OPEN);
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
    #[cfg(test)]
    pub(crate) fn guard(&self, permit: Permit) -> Guard<'_> {
        let mut held = SmallVec::new();
        held.push((Held::Borrowed(self), permit));
        Guard { held }
    }

    fn refuse(&self) -> Permit {
        self.short_circuited.fetch_add(1, Ordering::Relaxed);
        Permit::Refuse
    }

    /// The answer to a permitted call: `None` for a success, else the error.
    pub(crate) fn record(&self, permit: Permit, error: Option<&StoreError>) {
        if permit == Permit::Refuse {
            return;
        }
        let Some(error) = error else {
            if permit == Permit::Call && self.state.load(Ordering::Acquire) == CLOSED {
                // The hot path: no lock, and no write unless a streak is broken.
                if self.streak.load(Ordering::Relaxed) != 0 {
                    self.streak.store(0, Ordering::Relaxed);
                }
                return;
            }
            self.succeeded(permit);
            return;
        };
        self.failures.fetch_add(1, Ordering::Relaxed);
        // A deadline miss may be this host's slow moment; anything else is
        // Redis (or the network) saying no.
        let definite = !matches!(error, StoreError::Timeout | StoreError::Late);
        let now = Instant::now();
        let ms = now.saturating_duration_since(self.born).as_millis() as u64 + 1;
        let mut word = self.streak.load(Ordering::Relaxed);
        let (since, count, in_a_row) = loop {
            let (since, count, in_a_row) = streak_parts(word);
            let since = if word == 0 { ms } else { since };
            let count = (count + 1).min(COUNT_MAX);
            let in_a_row = if definite {
                (in_a_row + 1).min(COUNT_MAX)
            } else {
                0
            };
            let next = (since << (2 * COUNT_BITS)) | (count << COUNT_BITS) | in_a_row;
            match self.streak.compare_exchange_weak(
                word,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break (since, count, in_a_row),
                Err(w) => word = w,
            }
        };
        let failing_for = Duration::from_millis(ms.saturating_sub(since));
        let needed = u64::from(self.config.failures.max(1));
        let sustained = count >= needed && failing_for >= self.config.window;
        let mut inner = crate::sync::lock(&self.inner);
        if permit == Permit::Probe {
            inner.probes = inner.probes.saturating_sub(1);
        }
        let state = self.state.load(Ordering::Acquire);
        if state == HALF_OPEN || (state == CLOSED && (sustained || in_a_row >= needed)) {
            inner.open_until = Some(now + self.config.cool_off);
            self.state.store(OPEN, Ordering::Release);
            self.streak.store(0, Ordering::Relaxed);
            self.opened.fetch_add(1, Ordering::Relaxed);
            self.metrics.entered(OPEN);
            tracing::warn!(
                target: "fleetlimit",
                breaker = "open",
                failures = count,
                failing_ms = failing_for.as_millis() as u64,
                reason = error.reason(),
                cool_off_ms = self.config.cool_off.as_millis() as u64,
                "circuit breaker open: routes use their failure policy without calling the store"
            );
        }
    }

    fn succeeded(&self, permit: Permit) {
        let mut inner = crate::sync::lock(&self.inner);
        if permit == Permit::Probe {
            inner.probes = inner.probes.saturating_sub(1);
        }
        self.streak.store(0, Ordering::Relaxed);
        if self.state.swap(CLOSED, Ordering::AcqRel) != CLOSED {
            inner.open_until = None;
            self.closed.fetch_add(1, Ordering::Relaxed);
            self.metrics.entered(CLOSED);
            tracing::info!(target: "fleetlimit", breaker = "closed", "circuit breaker closed: the store answers again");
        }
    }

    fn abandon(&self, permit: Permit) {
        if permit == Permit::Probe {
            let mut inner = crate::sync::lock(&self.inner);
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

    fn is_idle(&self) -> bool {
        self.state.load(Ordering::Acquire) == CLOSED && self.streak.load(Ordering::Relaxed) == 0
    }
}

/// Most per-node breakers kept: above it, closed breakers with no failure
/// streak (which lose nothing when made again) are dropped. Redis Cluster's
/// own limit is about a thousand nodes.
const MAX_NODES: usize = 1_024;

/// The breakers in front of one store: one for the store as a whole
/// (standalone, Sentinel, or a cluster node not known yet), and one per
/// cluster node, made when a check first goes to that node.
#[derive(Debug)]
pub(crate) struct Breakers {
    config: BreakerConfig,
    whole: Breaker,
    nodes: RwLock<Vec<(Arc<str>, Arc<Breaker>)>>,
}

impl Breakers {
    pub(crate) fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            whole: Breaker::new(config),
            nodes: RwLock::new(Vec::new()),
        }
    }

    /// Permits for a check going to `nodes` (empty: the store as a whole),
    /// or `CircuitOpen` when any of them is open.
    pub(crate) fn enter(&self, nodes: &[String]) -> Result<Guard<'_>, StoreError> {
        let mut guard = Guard {
            held: SmallVec::new(),
        };
        if nodes.is_empty() {
            guard.take(Held::Borrowed(&self.whole))?;
        }
        for n in nodes {
            // A refusal drops the guard, which frees the permits taken.
            guard.take(Held::Owned(self.node(n)))?;
        }
        Ok(guard)
    }

    fn node(&self, name: &str) -> Arc<Breaker> {
        let found = |nodes: &[(Arc<str>, Arc<Breaker>)]| {
            nodes
                .iter()
                .find(|(n, _)| &**n == name)
                .map(|(_, b)| Arc::clone(b))
        };
        if let Some(b) = found(&self.nodes.read().unwrap_or_else(|e| e.into_inner())) {
            return b;
        }
        let mut nodes = self.nodes.write().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = found(&nodes) {
            return b;
        }
        if nodes.len() >= MAX_NODES {
            nodes.retain(|(_, b)| !b.is_idle());
        }
        let b = Arc::new(Breaker::named(self.config, name));
        if nodes.len() < MAX_NODES {
            nodes.push((Arc::from(name), Arc::clone(&b)));
        }
        b
    }

    /// Every breaker's counters added up; the state is the worst one's
    /// (open, else half-open, else closed).
    pub(crate) fn stats(&self) -> BreakerStats {
        let mut all = self.whole.stats();
        for (_, b) in self.node_stats() {
            all.opened += b.opened;
            all.closed += b.closed;
            all.short_circuited += b.short_circuited;
            all.failures += b.failures;
            all.state = match (all.state, b.state) {
                (BreakerState::Open, _) | (_, BreakerState::Open) => BreakerState::Open,
                (BreakerState::HalfOpen, _) | (_, BreakerState::HalfOpen) => BreakerState::HalfOpen,
                _ => BreakerState::Closed,
            };
        }
        all
    }

    /// Each cluster node's breaker, by `host:port`.
    pub(crate) fn node_stats(&self) -> Vec<(String, BreakerStats)> {
        let nodes = self.nodes.read().unwrap_or_else(|e| e.into_inner());
        nodes
            .iter()
            .map(|(n, b)| (n.to_string(), b.stats()))
            .collect()
    }
}

#[derive(Debug)]
pub(crate) enum Held<'a> {
    Borrowed(&'a Breaker),
    Owned(Arc<Breaker>),
}

impl std::ops::Deref for Held<'_> {
    type Target = Breaker;
    fn deref(&self) -> &Breaker {
        match self {
            Self::Borrowed(b) => b,
            Self::Owned(b) => b,
        }
    }
}

/// The permits of one check, in use; see [`Breakers::enter`]. A check
/// dropped before the store answered (the client went away, an outer
/// timeout) frees its probe slots without judging the store; otherwise a
/// half-open breaker would wait for that probe forever.
#[derive(Debug)]
pub(crate) struct Guard<'a> {
    held: SmallVec<[(Held<'a>, Permit); 1]>,
}

impl<'a> Guard<'a> {
    fn take(&mut self, b: Held<'a>) -> Result<(), StoreError> {
        match b.permit() {
            Permit::Refuse => Err(StoreError::CircuitOpen),
            p => {
                self.held.push((b, p));
                Ok(())
            }
        }
    }

    /// The check's answer: `None` for a success, else its error (counted
    /// against every node the check went to).
    pub(crate) fn record(mut self, error: Option<&StoreError>) {
        for (b, p) in self.held.drain(..) {
            b.record(p, error);
        }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        for (b, p) in self.held.drain(..) {
            b.abandon(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFUSED: Option<&StoreError> = Some(&StoreError::Unavailable(String::new()));
    const LATE: Option<&StoreError> = Some(&StoreError::Timeout);

    fn breaker(failures: u32) -> Breaker {
        Breaker::new(BreakerConfig {
            failures,
            window: Duration::from_millis(100),
            cool_off: Duration::from_secs(1),
            probes: 1,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn definite_errors_in_a_row_open_it_then_it_probes_and_closes() {
        let b = breaker(3);
        for _ in 0..2 {
            let p = b.permit();
            assert_eq!(p, Permit::Call);
            b.record(p, REFUSED);
        }
        // A success breaks the streak.
        b.record(b.permit(), None);
        for _ in 0..3 {
            let p = b.permit();
            b.record(p, REFUSED);
        }
        assert_eq!(b.stats().state, BreakerState::Open);
        assert_eq!(b.permit(), Permit::Refuse);
        tokio::time::advance(Duration::from_millis(1001)).await;
        let probe = b.permit();
        assert_eq!(probe, Permit::Probe);
        assert_eq!(b.permit(), Permit::Refuse, "one probe at a time");
        // The probe fails, even by a deadline miss: open for another cool-off.
        b.record(probe, LATE);
        assert_eq!(b.permit(), Permit::Refuse);
        tokio::time::advance(Duration::from_millis(1001)).await;
        let probe = b.permit();
        b.record(probe, None);
        let s = b.stats();
        assert_eq!(s.state, BreakerState::Closed);
        assert_eq!((s.opened, s.closed, s.short_circuited), (2, 1, 3));
        assert_eq!(b.permit(), Permit::Call);
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_misses_of_one_stall_do_not_open_it() {
        let b = breaker(3);
        // A busy host: 50 checks in flight all miss the deadline at once.
        for _ in 0..50 {
            b.record(b.permit(), LATE);
        }
        assert_eq!(b.stats().state, BreakerState::Closed);
        // The next ones are answered: the streak is over.
        tokio::time::advance(Duration::from_millis(5)).await;
        b.record(b.permit(), None);
        // Another stall, later: still one moment each.
        tokio::time::advance(Duration::from_millis(200)).await;
        for _ in 0..50 {
            b.record(b.permit(), LATE);
        }
        let s = b.stats();
        assert_eq!(
            (s.state, s.opened, s.failures),
            (BreakerState::Closed, 0, 100)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_misses_for_the_window_with_no_success_open_it() {
        let b = breaker(3);
        // A frozen Redis: every check misses its deadline, one every 20 ms.
        for i in 0..5 {
            b.record(b.permit(), LATE);
            assert_eq!(b.stats().state, BreakerState::Closed, "miss {i}");
            tokio::time::advance(Duration::from_millis(20)).await;
        }
        // 100 ms after the first miss.
        b.record(b.permit(), LATE);
        assert_eq!(b.stats().state, BreakerState::Open);
        assert_eq!(b.permit(), Permit::Refuse);
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_restarts_the_window_and_few_misses_never_open_it() {
        let b = breaker(3);
        for _ in 0..2 {
            for _ in 0..9 {
                b.record(b.permit(), LATE);
                tokio::time::advance(Duration::from_millis(10)).await;
            }
            b.record(b.permit(), None);
        }
        assert_eq!(b.stats().state, BreakerState::Closed);
        // Two misses a long time apart: sustained, but not enough of them.
        b.record(b.permit(), LATE);
        tokio::time::advance(Duration::from_secs(60)).await;
        b.record(b.permit(), LATE);
        assert_eq!(b.stats().state, BreakerState::Closed);
        b.record(b.permit(), LATE);
        assert_eq!(b.stats().state, BreakerState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_miss_breaks_a_run_of_definite_errors() {
        let b = breaker(3);
        b.record(b.permit(), REFUSED);
        b.record(b.permit(), REFUSED);
        b.record(b.permit(), LATE);
        b.record(b.permit(), REFUSED);
        b.record(b.permit(), REFUSED);
        assert_eq!(b.stats().state, BreakerState::Closed);
        b.record(b.permit(), REFUSED);
        assert_eq!(b.stats().state, BreakerState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn an_abandoned_probe_frees_its_slot() {
        let b = breaker(1);
        b.record(b.permit(), REFUSED);
        tokio::time::advance(Duration::from_millis(1001)).await;
        let probe = b.guard(b.permit());
        assert_eq!(b.permit(), Permit::Refuse, "one probe at a time");
        drop(probe);
        // Not judged: still half-open, and the next caller probes.
        assert_eq!(b.stats().state, BreakerState::HalfOpen);
        let p = b.permit();
        assert_eq!(p, Permit::Probe);
        b.guard(p).record(None);
        assert_eq!(b.stats().state, BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn each_node_has_its_own_breaker() {
        let all = Breakers::new(BreakerConfig {
            failures: 1,
            ..BreakerConfig::default()
        });
        let (a, b) = (
            vec!["10.0.0.1:7000".to_owned()],
            vec!["10.0.0.2:7000".to_owned()],
        );
        all.enter(&a).unwrap().record(REFUSED);
        // Node a is open; node b and the store as a whole are not.
        assert_eq!(all.enter(&a).unwrap_err(), StoreError::CircuitOpen);
        all.enter(&b).unwrap().record(None);
        all.enter(&[]).unwrap().record(None);
        // A check over both nodes waits for both.
        let both = [a[0].clone(), b[0].clone()];
        assert_eq!(all.enter(&both).unwrap_err(), StoreError::CircuitOpen);
        let s = all.stats();
        assert_eq!(
            (s.state, s.opened, s.failures, s.short_circuited),
            (BreakerState::Open, 1, 1, 2)
        );
        let nodes = all.node_stats();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].0, "10.0.0.1:7000");
        assert_eq!(nodes[0].1.state, BreakerState::Open);
        assert_eq!(nodes[1].1.state, BreakerState::Closed);
        // After the cool-off a's probe closes it.
        tokio::time::advance(Duration::from_millis(501)).await;
        all.enter(&a).unwrap().record(None);
        assert_eq!(all.stats().state, BreakerState::Closed);
    }

    #[test]
    fn node_breakers_are_bounded() {
        let all = Breakers::new(BreakerConfig::default());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            for i in 0..3 * MAX_NODES {
                all.enter(&[format!("10.0.{}.{}:7000", i / 256, i % 256)])
                    .unwrap()
                    .record(None);
            }
        });
        assert!(all.node_stats().len() <= MAX_NODES);
    }
}
