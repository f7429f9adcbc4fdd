//! CoDel's overload test on queueing delay: overloaded once every request
//! measured for a whole `interval` waited longer than `target` (the minimum
//! delay over the interval stayed above it), and no longer as soon as one
//! request waits less. A queue that only bursts drains within an interval
//! and never trips it; a standing queue does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The overload state of one instance's queue, shared by every request
/// without a lock: each sample is one compare-and-swap on one word, so
/// requests never wait on each other to be measured.
#[derive(Debug)]
pub(crate) struct Codel {
    target: Duration,
    /// Nanoseconds.
    interval: u64,
    /// Times below are nanoseconds since this, plus one (0: none).
    epoch: Instant,
    /// Bit 0: overloaded. Above it: since the first sample above target,
    /// when the interval it must last ends (0: the last sample was below
    /// target). One word, so a sample changes both at once, as under a
    /// lock.
    state: AtomicU64,
    /// The last sample: with no request measured (none arrives, or none
    /// carries `Accepted`) there is no delay to go by, so a verdict older
    /// than an interval lapses.
    last: AtomicU64,
}

const OVERLOADED: u64 = 1;
/// Compare-and-swap attempts of one sample.
const SAMPLE_ATTEMPTS: usize = 8;

impl Codel {
    pub(crate) fn new(target: Duration, interval: Duration) -> Self {
        Self {
            target,
            interval: nanos(interval),
            epoch: Instant::now(),
            state: AtomicU64::new(0),
            last: AtomicU64::new(0),
        }
    }

    /// `now` as stored: nanoseconds since the epoch, plus one.
    fn at(&self, now: Instant) -> u64 {
        nanos(now.saturating_duration_since(self.epoch)).saturating_add(1)
    }

    /// One request waited `delay` in front of the layer (at `now`).
    pub(crate) fn sample(&self, delay: Duration, now: Instant) {
        let t = self.at(now);
        self.last.fetch_max(t, Ordering::Relaxed);
        let mut cur = self.state.load(Ordering::Relaxed);
        // A retry means another sample landed; past a few, this one is
        // dropped (the next request's sample stands for it).
        for _ in 0..SAMPLE_ATTEMPTS {
            let new = if delay < self.target {
                0
            } else {
                match cur >> 1 {
                    0 => (t.saturating_add(self.interval) << 1) | (cur & OVERLOADED),
                    end if t >= end => cur | OVERLOADED,
                    _ => cur,
                }
            };
            if new == cur {
                return;
            }
            match self
                .state
                .compare_exchange(cur, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Whether the queue may be overloaded, without reading the clock:
    /// `false` means [`overloaded`](Self::overloaded) is `false` too.
    pub(crate) fn may_be_overloaded(&self) -> bool {
        self.state.load(Ordering::Relaxed) & OVERLOADED != 0
    }

    /// Whether the queue has stood above target for an interval (and a
    /// request was measured within the last interval).
    pub(crate) fn overloaded(&self, now: Instant) -> bool {
        if !self.may_be_overloaded() {
            return false;
        }
        let last = self.last.load(Ordering::Relaxed);
        last != 0 && self.at(now) < last.saturating_add(self.interval)
    }
}

/// Whole nanoseconds, saturated (a 64-bit count lasts centuries).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX >> 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: Duration = Duration::from_millis(5);
    const INTERVAL: Duration = Duration::from_millis(100);

    /// Samples of `delay` every 10 ms for `span`.
    async fn feed(c: &mut Codel, delay: Duration, span: Duration) {
        let end = Instant::now() + span;
        while Instant::now() < end {
            c.sample(delay, Instant::now());
            tokio::time::advance(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn delay_above_target_for_a_whole_interval_is_overload() {
        let mut c = Codel::new(TARGET, INTERVAL);
        feed(
            &mut c,
            Duration::from_millis(20),
            INTERVAL - Duration::from_millis(20),
        )
        .await;
        assert!(!c.overloaded(Instant::now()), "not a whole interval yet");
        feed(&mut c, Duration::from_millis(20), Duration::from_millis(40)).await;
        assert!(c.overloaded(Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_single_good_sample_ends_it() {
        let mut c = Codel::new(TARGET, INTERVAL);
        feed(&mut c, Duration::from_millis(20), INTERVAL * 2).await;
        assert!(c.overloaded(Instant::now()));
        c.sample(Duration::from_millis(1), Instant::now());
        assert!(!c.overloaded(Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_good_sample_within_the_interval_restarts_it() {
        let mut c = Codel::new(TARGET, INTERVAL);
        feed(&mut c, Duration::from_millis(20), INTERVAL / 2).await;
        c.sample(Duration::ZERO, Instant::now());
        feed(&mut c, Duration::from_millis(20), INTERVAL * 3 / 4).await;
        assert!(
            !c.overloaded(Instant::now()),
            "the bad stretch restarted at the good sample"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn short_bursts_never_trip_it() {
        let mut c = Codel::new(TARGET, INTERVAL);
        for _ in 0..20 {
            feed(&mut c, Duration::from_millis(50), INTERVAL / 2).await;
            c.sample(Duration::from_millis(1), Instant::now());
            assert!(!c.overloaded(Instant::now()));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_verdict_lapses_without_samples() {
        let mut c = Codel::new(TARGET, INTERVAL);
        feed(&mut c, Duration::from_millis(20), INTERVAL * 2).await;
        assert!(c.overloaded(Instant::now()));
        tokio::time::advance(INTERVAL).await;
        assert!(
            !c.overloaded(Instant::now()),
            "everything shed, nothing measured: not overloaded on old news"
        );
    }
}
