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
pub(crate) struct Estimate {
    idx: f64,
    windows: Windows,
}

impl Estimate {
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

/// The last µs (Redis's clock) of the window the script counted in at
/// `now_us`, `x` ms into it (−1 − that when the cost did not fit): the
/// script's windows are whole ms of `TIME` (see lua/sliding_window.lua).
pub(crate) fn window_end(window: Duration, now_us: i64, x: f64) -> i64 {
    let elapsed = if x >= 0.0 { x } else { -1.0 - x } as i64;
    let now_ms = now_us.div_euclid(1000);
    (now_ms - elapsed + window.as_millis() as i64) * 1000 - 1
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

/// The state the script takes the stored value `raw` for at `now_us` on
/// Redis's clock (`lua/sliding_window.lua`): three numbers (as Lua's
/// `tonumber` reads them) separated by single spaces, the first a whole
/// window index no later than the current window's, the counts from 0 to
/// 2^53. `None`: not a state fleetlimit wrote, which the limiter takes as
/// two empty windows.
pub(crate) fn stored_windows(raw: &str, window: Duration, now_us: f64) -> Option<(f64, f64, f64)> {
    let is_space = |c: char| matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r');
    let parts: Vec<&str> = raw.split(' ').collect();
    let [x, y, z] = parts.as_slice() else {
        return None;
    };
    if [x, y, z]
        .iter()
        .any(|p| p.is_empty() || p.contains(is_space))
    {
        return None;
    }
    let (idx, curr, prev) = (
        super::lua_number(x)?,
        super::lua_number(y)?,
        super::lua_number(z)?,
    );
    let count = |c: f64| (0.0..=9_007_199_254_740_992.0).contains(&c);
    let ok = idx.is_finite() && idx.fract() == 0.0 && idx <= current_index(window, now_us);
    (ok && count(curr) && count(prev)).then_some((idx, curr, prev))
}

/// The index of the window `now_us` falls in, as the script counts it (in
/// whole ms).
fn current_index(window: Duration, now_us: f64) -> f64 {
    let now_ms = (now_us / 1000.0).floor();
    (now_ms / window.as_millis() as f64).floor()
}

/// A valid state at `now_us`, for people.
pub(crate) fn reading(
    limit: f64,
    window: Duration,
    (idx, curr, prev): (f64, f64, f64),
    now_us: f64,
) -> super::Stored {
    let level = Estimate::read(limit, window, Some((idx, curr, prev)), now_us / 1e6);
    let remaining = level.avail().clamp(0.0, limit);
    let now_idx = current_index(window, now_us);
    let text = if idx == now_idx {
        format!("{curr} in this window, {prev} in the previous one, of {limit}")
    } else if idx == now_idx - 1.0 {
        format!("{curr} in the previous window, of {limit}")
    } else {
        format!("an older window's count, which weighs nothing now, of {limit}")
    };
    let text = format!("{text}: {} left", super::num(remaining, 2));
    super::Stored::Valid { remaining, text }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_ends_at_its_next_boundary() {
        let w = Duration::from_secs(3);
        // At 7.5004 s, 1,500 ms into [6 s, 9 s): its last µs is 9 s − 1 µs,
        // whether the cost fitted (1500) or not (−1 − 1500).
        assert_eq!(window_end(w, 7_500_400, 1500.0), 8_999_999);
        assert_eq!(window_end(w, 7_500_400, -1501.0), 8_999_999);
    }

    #[test]
    fn weights_the_previous_window() {
        let w = Duration::from_secs(10);
        // 10 in window [0, 10), then at t = 12.5 the previous weighs 75%.
        let l = Estimate::read(10.0, w, Some((0.0, 10.0, 0.0)), 12.5);
        assert!((l.avail() - 2.5).abs() < 1e-9);
        // 3 does not fit: the previous window must fade to 7, at t = 13.
        assert!((l.report(3.0, false).wait - 0.5).abs() < 1e-9);
    }

    #[test]
    fn a_stored_state_is_read_as_the_script_reads_it() {
        let w = Duration::from_secs(10);
        // At t = 1000.5 s: window 100.
        let now = 1_000.5e6;
        let read = |raw: &str| stored_windows(raw, w, now);
        assert_eq!(read("100 3 4"), Some((100.0, 3.0, 4.0)));
        assert_eq!(read("99 3 4"), Some((99.0, 3.0, 4.0)));
        assert_eq!(
            read("0x64 3 4"),
            Some((100.0, 3.0, 4.0)),
            "hex, as tonumber"
        );
        assert_eq!(read("100 1.5 0"), Some((100.0, 1.5, 0.0)));
        for bad in [
            "101 3 4",
            "100 3",
            "100 3 4 5",
            "100  3 4",
            "100 -1 4",
            "100 inf 0",
            "100 1e400 0",
            "nan 1 1",
            "100.5 1 1",
            "100 3 9007199254740994",
            "",
        ] {
            assert_eq!(read(bad), None, "{bad:?}");
        }
    }
}
