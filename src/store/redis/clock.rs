//! Redis's clock as this instance knows it, for the "not after" bound each
//! script call carries.
//!
//! Redis runs whatever reached its socket, whenever it wakes: a command
//! written before a freeze or a network cut runs seconds later, after its
//! caller has answered the request by the route's failure policy. So each
//! call says, on Redis's own clock (`TIME`), the latest moment it may
//! still charge anything; a script that reads a later `TIME` changes
//! nothing and answers `LATE`.
//!
//! That moment is when the caller stops waiting, on this host's monotonic
//! clock, moved onto Redis's: every answer carries Redis's `TIME`, and a
//! call handed at `sent` and answered at `read` says that Redis's clock
//! minus ours lay between `now − read` and `now − sent` when it ran. The
//! bounds of all answers are intersected (the lower one only rises), and
//! the bound sent is the caller's give-up moment plus the LOWER bound: on
//! Redis's clock, no later than the caller stops waiting, whatever the
//! round trip was. So a check Redis runs after its caller gave up is never
//! charged; one it runs in time is, and its answer is read (the caller
//! waits until then, see `deadline.rs`).
//!
//! Clocks that move: when an answer's bounds miss the known ones (Redis's
//! clock stepped, or drifted past the round trip, or a failover brought a
//! primary on another host), the known bounds are replaced by that
//! answer's. A step forward makes calls answered `LATE` until the next
//! answer corrects it (the caller retries once, see `deadline.rs`); a step
//! back by `d` lets a late check through within `d` until an answer
//! replaces the bounds (the next one does). A Redis clock that runs at
//! another rate than ours (not seen with NTP's slews of at most 500 ppm)
//! is corrected the same way, an answer at a time. Before the first
//! answer (the store asks `TIME` when it connects) calls carry no bound.

use std::sync::Mutex;

use tokio::time::Instant;

/// Highest Redis time (µs) an answer may carry: Lua's doubles hold every
/// integer up to 2^53, and Redis's clock in µs is near 2^50.8 until 2100.
const MAX_US: i64 = 1 << 53;

/// Redis's clock as seen from this instance (one per Redis primary).
#[derive(Debug)]
pub(crate) struct RedisClock {
    base: Instant,
    /// Bounds (µs) on Redis's `TIME` minus µs since `base` here; `None`
    /// until an answer said.
    offset: Mutex<Option<(i64, i64)>>,
}

impl RedisClock {
    pub(crate) fn new() -> Self {
        Self {
            base: Instant::now(),
            offset: Mutex::new(None),
        }
    }

    fn local_us(&self, at: Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.base).as_micros()).unwrap_or(i64::MAX)
    }

    /// Redis's time, in µs, that is no later than `at` here: the "not
    /// after" bound of a call whose caller stops waiting at `at`. `None`
    /// until Redis's clock is known.
    pub(crate) fn not_after(&self, at: Instant) -> Option<i64> {
        let (lo, _) = (*crate::sync::lock(&self.offset))?;
        Some(self.local_us(at).saturating_add(lo))
    }

    /// A call handed at `sent` and answered now was run when Redis's clock
    /// read `redis_now` µs. An answer no Redis gives (0, negative, past
    /// 2^53) teaches nothing; `false` says so.
    pub(crate) fn observe(&self, sent: Instant, redis_now: i64) -> bool {
        if !(0 < redis_now && redis_now < MAX_US) {
            return false;
        }
        let read = self.local_us(Instant::now());
        let sample = (redis_now - read, redis_now - self.local_us(sent));
        let mut known = crate::sync::lock(&self.offset);
        *known = Some(match *known {
            Some((lo, hi)) if sample.0 <= hi && lo <= sample.1 => {
                (lo.max(sample.0), hi.min(sample.1))
            }
            // Redis's clock moved (or this is the first answer).
            _ => sample,
        });
        true
    }

    /// The known bounds on Redis's clock minus ours, in µs (tests, `explain`).
    #[cfg(test)]
    pub(crate) fn bounds(&self) -> Option<(i64, i64)> {
        *crate::sync::lock(&self.offset)
    }
}

/// Asks `pool`'s Redis for its `TIME` once, so the first checks carry a
/// bound; a failure leaves the clock unknown (the checks' answers teach it).
pub(crate) async fn learn(pool: &fred::clients::Pool, clock: &RedisClock) {
    use fred::interfaces::ClientLike;
    use fred::types::{ClusterHash, CustomCommand, Value};

    let time = CustomCommand::new_static("TIME", ClusterHash::Random, false);
    let sent = Instant::now();
    let asked = pool
        .next()
        .custom::<Value, Value>(time, Vec::<Value>::new());
    let Ok(Ok(Value::Array(parts))) =
        tokio::time::timeout(std::time::Duration::from_secs(1), asked).await
    else {
        return;
    };
    let part = |i: usize| parts.get(i).and_then(Value::as_i64);
    if let (Some(secs), Some(us)) = (part(0), part(1)) {
        clock.observe(sent, secs.saturating_mul(1_000_000).saturating_add(us));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Redis's clock, `offset` µs ahead of the test's.
    fn redis_at(clock: &RedisClock, at: Instant, offset: i64) -> i64 {
        clock.local_us(at) + offset
    }

    #[tokio::test(start_paused = true)]
    async fn the_bound_is_never_later_than_the_give_up_moment() {
        let clock = RedisClock::new();
        assert_eq!(clock.not_after(Instant::now()), None, "unknown at first");
        let offset = 1_700_000_000_000_000;
        // A call answered after 300 µs, run 100 µs after it was sent.
        let sent = Instant::now();
        tokio::time::advance(Duration::from_micros(100)).await;
        let ran = redis_at(&clock, Instant::now(), offset);
        tokio::time::advance(Duration::from_micros(200)).await;
        assert!(clock.observe(sent, ran));
        assert_eq!(clock.bounds(), Some((offset - 200, offset + 100)));
        let give_up = Instant::now() + Duration::from_millis(5);
        let bound = clock.not_after(give_up).unwrap();
        assert!(bound <= redis_at(&clock, give_up, offset));
        assert!(redis_at(&clock, give_up, offset) - bound <= 200);
        // A quicker answer narrows the bounds; a slower one does not widen them.
        let sent = Instant::now();
        let ran = redis_at(&clock, sent, offset);
        tokio::time::advance(Duration::from_micros(10)).await;
        assert!(clock.observe(sent, ran));
        assert_eq!(clock.bounds(), Some((offset - 10, offset)));
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(3)).await;
        assert!(clock.observe(sent, redis_at(&clock, Instant::now(), offset)));
        assert_eq!(clock.bounds(), Some((offset, offset)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_that_steps_replaces_the_bounds() {
        let clock = RedisClock::new();
        let offset = 1_700_000_000_000_000;
        let sent = Instant::now();
        tokio::time::advance(Duration::from_micros(50)).await;
        assert!(clock.observe(sent, redis_at(&clock, Instant::now(), offset)));
        // Redis's clock steps back a second: the next answer replaces the
        // bounds, so the bound is again no later than the caller's.
        let stepped = offset - 1_000_000;
        let sent = Instant::now();
        tokio::time::advance(Duration::from_micros(50)).await;
        assert!(clock.observe(sent, redis_at(&clock, Instant::now(), stepped)));
        let (lo, hi) = clock.bounds().unwrap();
        assert!(lo <= stepped && stepped <= hi, "{lo} {hi}");
        // And forward.
        let stepped = offset + 3_000_000;
        let sent = Instant::now();
        assert!(clock.observe(sent, redis_at(&clock, Instant::now(), stepped)));
        assert_eq!(clock.bounds(), Some((stepped, stepped)));
    }

    #[tokio::test(start_paused = true)]
    async fn answers_no_redis_gives_are_ignored() {
        let clock = RedisClock::new();
        for bad in [0, -5, MAX_US, i64::MAX, i64::MIN] {
            assert!(!clock.observe(Instant::now(), bad), "{bad}");
        }
        assert_eq!(clock.bounds(), None);
    }
}
