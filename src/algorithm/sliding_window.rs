//! Sliding window counter: at most about `limit` per `window`, estimated
//! from two fixed windows (previous × its overlap with the sliding window,
//! plus current). This file holds its arithmetic (the estimate and the wait
//! until a cost fits), its Lua (`lua/sliding_window.lua`), its TTL rule and
//! the decoder of a stored state.

use std::time::Duration;

use super::LimitState;

macro_rules! lua {
    () => {
        include_str!("../../lua/sliding_window.lua")
    };
}
pub(crate) use lua;

/// The two windows at `elapsed` into the current one (any unit, `w` long).
#[derive(Clone, Copy, Debug)]
struct Windows {
    limit: f64,
    w: f64,
    elapsed: f64,
    curr: f64,
    prev: f64,
}

impl Windows {
    fn estimate(&self) -> f64 {
        self.prev * (self.w - self.elapsed) / self.w + self.curr
    }

    /// How long until `cost` fits (0 when it does).
    fn wait(&self, cost: f64) -> f64 {
        let (limit, w, elapsed, curr, prev) =
            (self.limit, self.w, self.elapsed, self.curr, self.prev);
        if self.estimate() + cost <= limit {
            0.0
        } else if curr + cost <= limit {
            // The previous window's weight has to fade a little more.
            (w - elapsed) - (limit - curr - cost) * w / prev
        } else if curr > 0.0 {
            // Only after this window ends, once its count fades in turn.
            (w - elapsed) + (w * (1.0 - (limit - cost) / curr)).max(0.0)
        } else {
            // The cost alone exceeds the limit (a local share): the next
            // window is the best there is.
            w - elapsed
        }
    }

    /// How long until both windows weigh nothing.
    fn reset(&self) -> f64 {
        if self.curr > 0.0 {
            2.0 * self.w - self.elapsed
        } else if self.prev > 0.0 {
            self.w - self.elapsed
        } else {
            0.0
        }
    }
}

/// One key at `now` (seconds), before and after a charge.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Level {
    idx: f64,
    windows: Windows,
}

impl Level {
    /// `stored`: the index of the window it was written in, its count and
    /// the previous window's.
    pub(crate) fn read(
        limit: f64,
        window: Duration,
        stored: Option<(f64, f64, f64)>,
        now: f64,
    ) -> Self {
        let w = window.as_secs_f64();
        let idx = (now / w).floor();
        let (curr, prev) = match stored {
            Some((s, curr, prev)) if s == idx => (curr, prev),
            Some((s, curr, _)) if s == idx - 1.0 => (0.0, curr),
            _ => (0.0, 0.0),
        };
        Self {
            idx,
            windows: Windows {
                limit,
                w,
                elapsed: now - idx * w,
                curr,
                prev,
            },
        }
    }

    pub(crate) fn avail(&self) -> f64 {
        self.windows.limit - self.windows.estimate()
    }

    /// Charges `cost` (a refund never below zero); returns the new state
    /// and when it weighs nothing (the end of the next window).
    pub(crate) fn write(&mut self, cost: f64) -> ((f64, f64, f64), f64) {
        let s = &mut self.windows;
        s.curr = (s.curr + cost).max(0.0);
        ((self.idx, s.curr, s.prev), (self.idx + 2.0) * s.w)
    }

    pub(crate) fn report(&self, cost: f64, enough: bool) -> LimitState {
        LimitState {
            enough,
            remaining: self.avail(),
            wait: self.windows.wait(cost),
            reset: self.windows.reset(),
            capacity: self.windows.limit,
        }
    }
}

/// The state of a key from the general script's answer for it: ms into
/// the current window (−1 − that when the cost did not fit), then the
/// current and the previous window's counts after the decision.
pub(crate) fn script_answer(
    limit: f64,
    window: Duration,
    cost: f64,
    x: f64,
    curr: f64,
    prev: f64,
) -> LimitState {
    let enough = x >= 0.0;
    // In ms, as the script counts.
    let w = Windows {
        limit,
        w: window.as_millis() as f64,
        elapsed: if enough { x } else { -1.0 - x },
        curr,
        prev,
    };
    LimitState {
        enough,
        remaining: limit - w.estimate(),
        wait: w.wait(cost) / 1000.0,
        reset: w.reset() / 1000.0,
        capacity: limit,
    }
}

/// The longest a key lives: to the end of the next window (the script's
/// `SET ... PX`).
pub(crate) fn max_ttl(window: Duration) -> Duration {
    2 * window
}

/// The rule in words.
pub(crate) fn rule_text(limit: f64, window: Duration) -> String {
    format!(
        "sliding window of {limit} per {}",
        super::fmt_duration(window)
    )
}

/// A stored value, for people.
pub(crate) fn describe(limit: f64, raw: &str) -> String {
    let v: Vec<&str> = raw.split_whitespace().collect();
    match v.as_slice() {
        [idx, curr, prev] => {
            format!("window {idx}: {curr} now, {prev} in the previous one, of {limit}")
        }
        _ => format!("unreadable sliding window: {raw:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_the_previous_window() {
        let w = Duration::from_secs(10);
        // 10 in window [0, 10), then at t = 12.5 the previous weighs 75%.
        let l = Level::read(10.0, w, Some((0.0, 10.0, 0.0)), 12.5);
        assert!((l.avail() - 2.5).abs() < 1e-9);
        // 3 does not fit: the previous window must fade to 7, at t = 13.
        assert!((l.report(3.0, false).wait - 0.5).abs() < 1e-9);
    }
}
