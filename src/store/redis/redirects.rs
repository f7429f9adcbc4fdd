//! A Cluster's calls across slots: whether the cluster refuses the script
//! flag they need (`allow-cross-slot-keys`), and the calls that met a slot
//! on the move, counted (`per_node.rs` sends them).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::store::StoreError;

/// Calls on a Cluster that met a slot on the move (`MOVED`, `ASK`,
/// `TRYAGAIN`, `CROSSSLOT`, or a flagged call's key that was not its
/// node's), and how they ended: counted since the store started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Redirects {
    /// Calls (one per group of checks sent together) that met one.
    pub calls: u64,
    /// Of those, the calls whose every check Redis decided.
    pub decided: u64,
    /// Of those, the calls with a check left to its route's failure policy
    /// (the deadline passed, or Redis failed).
    pub by_policy: u64,
    /// The longest such a call took, from its first send to its last
    /// answer (µs).
    pub slowest_us: u64,
    /// Of those, the calls that met `MOVED` (the slot had moved).
    pub moved: u64,
    /// ... that met `ASK` (the slot was being moved, the key gone).
    pub ask: u64,
    /// ... that met `TRYAGAIN` or `CROSSSLOT` (keys of one call on both
    /// sides of a slot being moved): split into calls of one key.
    pub split: u64,
    /// ... whose call across slots met a key not its node's.
    pub not_local: u64,
}

/// The redirections a call can meet, as [`Redirects`] counts them.
pub(super) const KINDS: [&str; 4] = ["MOVED", "ASK", "TRYAGAIN", "not local"];

/// Whether the cluster refuses calls across slots, and [`Redirects`].
pub(crate) struct CrossSlot {
    refused: AtomicBool,
    calls: AtomicU64,
    decided: AtomicU64,
    by_policy: AtomicU64,
    slowest_us: AtomicU64,
    /// Per kind of [`KINDS`].
    kinds: [AtomicU64; 4],
}

impl CrossSlot {
    pub(crate) fn new() -> Self {
        Self {
            refused: AtomicBool::new(false),
            calls: AtomicU64::new(0),
            decided: AtomicU64::new(0),
            by_policy: AtomicU64::new(0),
            slowest_us: AtomicU64::new(0),
            kinds: Default::default(),
        }
    }

    /// Calls across slots may be sent (not refused so far).
    pub(crate) fn allowed(&self) -> bool {
        !self.refused.load(Ordering::Relaxed)
    }

    /// The cluster refused the flagged script: calls per slot from now on,
    /// said once.
    pub(crate) fn refuse(&self, error: &StoreError) {
        if !self.refused.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                target: "fleetlimit",
                %error,
                "the cluster refuses scripts flagged allow-cross-slot-keys (Redis 7 or newer \
                 has them): coalesced checks are sent in one call per slot"
            );
        }
    }

    pub(crate) fn redirects(&self) -> Redirects {
        Redirects {
            calls: self.calls.load(Ordering::Relaxed),
            decided: self.decided.load(Ordering::Relaxed),
            by_policy: self.by_policy.load(Ordering::Relaxed),
            slowest_us: self.slowest_us.load(Ordering::Relaxed),
            moved: self.kinds[0].load(Ordering::Relaxed),
            ask: self.kinds[1].load(Ordering::Relaxed),
            split: self.kinds[2].load(Ordering::Relaxed),
            not_local: self.kinds[3].load(Ordering::Relaxed),
        }
    }

    pub(crate) fn met(&self, kinds: &[&'static str], decided: bool, took: std::time::Duration) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        for (count, kind) in self.kinds.iter().zip(KINDS) {
            if kinds.contains(&kind) {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.slowest_us.fetch_max(us, Ordering::Relaxed);
        let end = if decided {
            &self.decided
        } else {
            &self.by_policy
        };
        end.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether Redis's error says it refuses the flagged script itself (an
/// unknown flag or shebang, or a Redis before 7 that reads `#!` as Lua).
pub(crate) fn refuses_flag(e: &StoreError) -> bool {
    let text = match e {
        StoreError::Redis(t) | StoreError::Script(t) | StoreError::Protocol(t) => t,
        _ => return false,
    };
    text.contains("shebang") || text.contains("Error compiling script")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_flag_is_told_from_other_errors() {
        // Redis 7 with a flag it does not know; Redis 6, which reads `#!`
        // as Lua.
        for text in [
            "ERR Unexpected flag in script shebang: allow-cross-slot-keys",
            "ERR Error compiling script (new function): user_script:1: unexpected symbol near '#'",
        ] {
            assert!(refuses_flag(&StoreError::Redis(text.into())), "{text}");
        }
        assert!(!refuses_flag(&StoreError::Redis(
            "OOM command not allowed".into()
        )));
        assert!(!refuses_flag(&StoreError::Timeout));
    }
}
