//! The concurrency slots this instance holds through the primary store,
//! per key: requests admitted by Redis and still in flight here. When
//! Redis fails, the `local` policy counts them against this instance's
//! share (see `fallback.rs`): a request admitted before the outage is still
//! a request in flight on this instance.
//!
//! Bounded by the requests in flight: a key's entry goes with its last slot.

use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Default)]
pub(in crate::pipeline) struct Held(Mutex<HashMap<String, u32>>);

impl Held {
    /// A slot of `key` taken through the primary store.
    pub(in crate::pipeline) fn take(&self, key: &str) {
        let mut map = crate::sync::lock(&self.0);
        match map.get_mut(key) {
            Some(n) => *n += 1,
            None => {
                map.insert(key.to_owned(), 1);
            }
        }
    }

    /// That request's response is over.
    pub(in crate::pipeline) fn give(&self, key: &str) {
        let mut map = crate::sync::lock(&self.0);
        if let Some(n) = map.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                map.remove(key);
            }
        }
    }

    /// The slots of `key` held now.
    pub(super) fn of(&self, key: &str) -> u32 {
        crate::sync::lock(&self.0).get(key).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_key_and_forgets_a_key_at_zero() {
        let h = Held::default();
        h.take("a");
        h.take("a");
        h.take("b");
        assert_eq!((h.of("a"), h.of("b"), h.of("c")), (2, 1, 0));
        h.give("a");
        h.give("b");
        h.give("c");
        assert_eq!((h.of("a"), h.of("b")), (1, 0));
        assert!(!crate::sync::lock(&h.0).contains_key("b"));
    }
}
