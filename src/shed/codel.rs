//! CoDel's overload test on queueing delay: overloaded once every request
//! measured for a whole `interval` waited longer than `target` (the minimum
//! delay over the interval stayed above it), and no longer as soon as one
//! request waits less. A queue that only bursts drains within an interval
//! and never trips it; a standing queue does.

use std::time::Duration;

use tokio::time::Instant;

/// The overload state of one instance's queue.
#[derive(Debug)]
pub(crate) struct Codel {
    target: Duration,
    interval: Duration,
    /// Since the first sample above target, when the interval it must last
    /// ends (`None`: the last sample was below target).
    above_until: Option<Instant>,
    overloaded: bool,
    /// The last sample: with no request measured (none arrives, or none
    /// carries `Accepted`) there is no delay to go by, so a verdict older
    /// than an interval lapses.
    last: Option<Instant>,
}

impl Codel {
    pub(crate) fn new(target: Duration, interval: Duration) -> Self {
        Self {
            target,
            interval,
            above_until: None,
            overloaded: false,
            last: None,
        }
    }

    /// One request waited `delay` in front of the layer (at `now`).
    pub(crate) fn sample(&mut self, delay: Duration, now: Instant) {
        self.last = Some(now);
        if delay < self.target {
            self.above_until = None;
            self.overloaded = false;
            return;
        }
        match self.above_until {
            None => self.above_until = Some(now + self.interval),
            Some(end) if now >= end => self.overloaded = true,
            Some(_) => {}
        }
    }

    /// Whether the queue has stood above target for an interval (and a
    /// request was measured within the last interval).
    pub(crate) fn overloaded(&self, now: Instant) -> bool {
        self.overloaded && self.last.is_some_and(|t| now < t + self.interval)
    }
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
