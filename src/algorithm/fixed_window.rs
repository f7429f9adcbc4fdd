//! Fixed window: at most `limit` per `window`, the window opening with the
//! key's first counted request (no fleet-wide reset at the top of the
//! minute). This file holds its arithmetic, its Lua
//! (`lua/fixed_window.lua`), its TTL rule and the decoder of a stored count.

use std::time::Duration;

use super::LimitState;

macro_rules! lua {
    () => {
        include_str!("../../lua/fixed_window.lua")
    };
}
pub(crate) use lua;

/// One window at `now` (seconds), before and after a charge.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Level {
    limit: f64,
    window: f64,
    count: f64,
    /// When the window closes; NaN until a charge opens it.
    ends: f64,
    now: f64,
}

impl Level {
    /// `stored`: the count and when its window closes.
    pub(crate) fn read(limit: f64, window: Duration, stored: Option<(f64, f64)>, now: f64) -> Self {
        let (count, ends) = match stored {
            Some((count, ends)) if ends > now => (count, ends),
            _ => (0.0, f64::NAN),
        };
        Self {
            limit,
            window: window.as_secs_f64(),
            count,
            ends,
            now,
        }
    }

    pub(crate) fn avail(&self) -> f64 {
        self.limit - self.count
    }

    /// Charges `cost` (a refund never below zero); returns the new count
    /// and when the window closes (it may then be forgotten).
    pub(crate) fn write(&mut self, cost: f64) -> (f64, f64) {
        self.count = (self.count + cost).max(0.0);
        if self.ends.is_nan() {
            self.ends = self.now + self.window;
        }
        (self.count, self.ends)
    }

    pub(crate) fn report(&self, cost: f64, enough: bool) -> LimitState {
        let left = if self.ends.is_nan() {
            0.0
        } else {
            (self.ends - self.now).max(0.0)
        };
        LimitState {
            enough,
            remaining: self.avail(),
            wait: if self.count + cost > self.limit {
                left
            } else {
                0.0
            },
            reset: left,
            capacity: self.limit,
        }
    }
}

/// The state of a window from the general script's answer for it: the
/// count after the decision (−1 − count when the cost did not fit) and the
/// window's PTTL in ms (≤ 0: no window open).
pub(crate) fn script_answer(limit: f64, cost: f64, x: f64, pttl_ms: f64) -> LimitState {
    let enough = x >= 0.0;
    Level {
        limit,
        window: 0.0,
        count: if enough { x } else { -1.0 - x },
        ends: if pttl_ms > 0.0 {
            pttl_ms / 1000.0
        } else {
            f64::NAN
        },
        now: 0.0,
    }
    .report(cost, enough)
}

/// The longest a key lives: the window (the script's `PEXPIRE`).
pub(crate) fn max_ttl(window: Duration) -> Duration {
    window
}

/// The rule in words.
pub(crate) fn rule_text(limit: f64, window: Duration) -> String {
    format!(
        "fixed window of {limit} per {}",
        super::fmt_duration(window)
    )
}

/// A stored value, for people.
pub(crate) fn describe(limit: f64, raw: &str) -> String {
    format!("{raw} of {limit} used in this window")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_with_the_first_request() {
        let w = Duration::from_secs(60);
        let mut l = Level::read(3.0, w, None, 10.0);
        let s = l.write(1.0);
        assert_eq!(s.1, 70.0);
        let l = Level::read(3.0, w, Some(s), 30.0);
        assert_eq!(l.avail(), 2.0);
        assert_eq!(l.report(3.0, false).wait, 40.0);
        assert_eq!(
            Level::read(3.0, w, Some(s), 70.0).avail(),
            3.0,
            "closed at its expiry"
        );
    }
}
