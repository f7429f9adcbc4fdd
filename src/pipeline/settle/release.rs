//! A concurrency slot taken by an admitted request, given back when its
//! response is over.

use std::sync::Arc;

use super::super::DecidedBy;
use super::super::check::Stores;
use crate::algorithm::LimitState;
use crate::store::Bucket;

/// A slot taken by an admitted request: its `Drop` gives it back to the
/// store that decided (Redis in the background, or the in-process store).
/// One taken through a primary store that can fail is counted in flight
/// here until then (`check/held.rs`), for the `local` policy.
pub(super) struct Release {
    stores: Arc<Stores>,
    by: DecidedBy,
    key: String,
    slot: String,
    /// Counted in flight for the `local` policy (`held.rs`).
    counted: bool,
}

impl Release {
    /// A guard for each concurrency bucket the request was counted in.
    pub(super) fn taken(
        stores: &Arc<Stores>,
        buckets: &[Bucket],
        limits: &[LimitState],
        slot: Option<&str>,
        by: DecidedBy,
    ) -> impl Iterator<Item = Self> + use<> {
        let stores = Arc::clone(stores);
        let slot = slot.map(str::to_owned);
        let taken: Vec<String> = buckets
            .iter()
            .zip(limits)
            .filter(|(b, s)| b.rule.is_concurrency() && s.enough)
            .map(|(b, _)| b.key.clone())
            .collect();
        taken.into_iter().filter_map(move |key| {
            let slot = slot.clone()?;
            // Only a store that can fail has `local` count them.
            let counted = by == DecidedBy::Primary && !stores.at_once();
            if counted {
                stores.local().held().take(&key);
            }
            Some(Self {
                stores: Arc::clone(&stores),
                by,
                key,
                slot,
                counted,
            })
        })
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if self.counted {
            self.stores.local().held().give(&self.key);
        }
        self.stores.release(self.by, &self.key, &self.slot);
    }
}
