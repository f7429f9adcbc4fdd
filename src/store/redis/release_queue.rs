//! The queue of a store's failed slot releases (see `release.rs`):
//! bounded, the oldest dropped first, one task at a time.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Most failed releases a store keeps to send again.
pub(crate) const MAX_QUEUED: usize = 4_096;
/// The first pause after a round that failed; it doubles up to
/// [`MAX_PAUSE`], short enough that a healed Redis gets its slots back
/// within a fraction of a second even without traffic.
pub(super) const FIRST_PAUSE: Duration = Duration::from_millis(50);
pub(super) const MAX_PAUSE: Duration = Duration::from_millis(250);
/// How often the task looks whether a check was answered meanwhile.
pub(super) const TICK: Duration = Duration::from_millis(20);
/// The longest `max_hold` the configuration accepts: past it, a slot no
/// longer counts, released or not.
pub(crate) const RETRY_FOR: Duration = Duration::from_secs(86_400);

pub(super) struct Queued {
    pub(super) key: String,
    pub(super) slot: String,
    pub(super) since: Instant,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Queued>,
    /// Taken out by the round under way (they count against the bound).
    in_round: usize,
    /// A task sends the queue.
    draining: bool,
}

/// A store's failed releases.
pub(crate) struct Releases {
    state: Mutex<State>,
}

impl Releases {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State::default()),
        }
    }

    /// Queues `entries` behind those already there (`front`: before
    /// them, the older ones a round puts back, its end), drops the oldest
    /// queued past [`MAX_QUEUED`] (those of a round under way included);
    /// how many were dropped, and whether a task must be started.
    pub(super) fn put(&self, entries: Vec<Queued>, front: bool) -> (usize, bool) {
        let mut st = crate::sync::lock(&self.state);
        if front {
            st.in_round = 0;
            for q in entries.into_iter().rev() {
                st.queue.push_front(q);
            }
        } else {
            st.queue.extend(entries);
        }
        let over = (st.queue.len() + st.in_round).saturating_sub(MAX_QUEUED);
        let over = over.min(st.queue.len());
        st.queue.drain(..over);
        let start = !st.draining && !st.queue.is_empty();
        st.draining |= start;
        (over, start)
    }

    /// Everything queued; `None` (and the task ends) when it is empty.
    pub(super) fn take(&self) -> Option<Vec<Queued>> {
        let mut st = crate::sync::lock(&self.state);
        if st.queue.is_empty() {
            st.draining = false;
            return None;
        }
        st.in_round = st.queue.len();
        Some(st.queue.drain(..).collect())
    }

    /// How many are queued.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        crate::sync::lock(&self.state).queue.len()
    }
}
