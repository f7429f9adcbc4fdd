//! Log lines that repeat per request (degraded decisions, refusals) are
//! written at most once a second per route or limit, with the number held
//! back since the previous line: an outage or an abusive client must not
//! turn into a log flood. One counter per route or limit, never per key, so
//! memory stays bounded whatever the traffic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, TryLockError};
use std::time::Duration;

use tokio::time::Instant;

/// At most one line per this long.
pub(crate) const PERIOD: Duration = Duration::from_secs(1);

/// Lets one line through per [`PERIOD`]; counts the others.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    /// When the next line may be written (`None`: at once).
    next: Mutex<Option<Instant>>,
    /// Events held back since the last line written.
    held: AtomicU64,
}

impl Throttle {
    /// For a `static`.
    pub(crate) const fn new() -> Self {
        Self {
            next: Mutex::new(None),
            held: AtomicU64::new(0),
        }
    }

    /// One event. `Some(n)`: write its line now, saying `n` like events were
    /// held back since the previous one. `None`: counted, write nothing.
    ///
    /// Never waits: while another thread is deciding, this event is simply
    /// counted (it shows up in the next line's number).
    pub(crate) fn event(&self) -> Option<u64> {
        // tokio's clock: paused time in tests moves it.
        let now = Instant::now();
        let guard = match self.next.try_lock() {
            Ok(g) => Some(g),
            // Nothing that holds it can panic; if something did, its value
            // is still a plain instant.
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        if let Some(mut next) = guard {
            if next.is_none_or(|t| now >= t) {
                *next = Some(now + PERIOD);
                return Some(self.held.swap(0, Ordering::AcqRel));
            }
        }
        self.held.fetch_add(1, Ordering::AcqRel);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_a_second_with_the_count_held_back() {
        let t = Throttle::default();
        assert_eq!(t.event(), Some(0));
        for _ in 0..49 {
            assert_eq!(t.event(), None);
        }
        tokio::time::advance(PERIOD - Duration::from_millis(1)).await;
        assert_eq!(t.event(), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(t.event(), Some(50));
        assert_eq!(t.event(), None);
        tokio::time::advance(PERIOD * 5).await;
        assert_eq!(t.event(), Some(1));
    }
}
