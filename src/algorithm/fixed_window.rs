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
pub(crate) struct Window {
    limit: f64,
    window: f64,
    count: f64,
    /// When the window closes; NaN until a charge opens it.
    ends: f64,
    now: f64,
}

impl Window {
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
    Window {
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

/// The last µs (Redis's clock) of the window the script answered `pttl_ms`
/// for at `now_us`: its key lives while its PTTL, in whole ms, is not yet
/// spent, and a window that opens after it is another count.
pub(crate) fn window_end(now_us: i64, pttl_ms: f64) -> Option<i64> {
    (pttl_ms >= 0.0).then(|| now_us + pttl_ms as i64 * 1000 - 1)
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

/// The count the script takes the stored value `raw` for, with the key's
/// `pttl_ms` (`lua/fixed_window.lua`): `"0"` or a positive integer of at
/// most 15 digits without sign, spaces or leading zeros, on a key whose
/// expiry is at most one window away or missing (older code). `None`: not
/// a state fleetlimit wrote, which the limiter takes as an empty window.
pub(crate) fn stored_count(raw: &str, pttl_ms: i64, window: Duration) -> Option<f64> {
    let b = raw.as_bytes();
    let digits = raw == "0"
        || (b.len() <= 15
            && b.first().is_some_and(|c| (b'1'..=b'9').contains(c))
            && b.iter().all(u8::is_ascii_digit));
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    (digits && pttl_ms != -2 && pttl_ms <= window_ms).then(|| raw.parse().unwrap_or(0.0))
}

/// A valid count with the key's `pttl_ms`, for people.
pub(crate) fn reading(limit: f64, count: f64, pttl_ms: i64) -> super::Stored {
    let ends = match pttl_ms {
        -1 => "no expiry (its next check gives it one)".to_owned(),
        ms => format!("the window ends in {} s", super::num(ms as f64 / 1000.0, 3)),
    };
    super::Stored::Valid {
        remaining: (limit - count).clamp(0.0, limit),
        text: format!("{count} of {limit} used in this window; {ends}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_ends_when_its_pttl_is_spent() {
        // 250 ms left at t = 10 s: its last µs is 10.25 s − 1 µs.
        assert_eq!(window_end(10_000_000, 250.0), Some(10_249_999));
        // No window open (the key is gone): nothing to give back into.
        assert_eq!(window_end(10_000_000, -2.0), None);
    }

    #[test]
    fn opens_with_the_first_request() {
        let w = Duration::from_secs(60);
        let mut l = Window::read(3.0, w, None, 10.0);
        let s = l.write(1.0);
        assert_eq!(s.1, 70.0);
        let l = Window::read(3.0, w, Some(s), 30.0);
        assert_eq!(l.avail(), 2.0);
        assert_eq!(l.report(3.0, false).wait, 40.0);
        assert_eq!(
            Window::read(3.0, w, Some(s), 70.0).avail(),
            3.0,
            "closed at its expiry"
        );
    }

    #[test]
    fn a_stored_count_is_read_as_the_script_reads_it() {
        let w = Duration::from_secs(60);
        assert_eq!(stored_count("12", 30_000, w), Some(12.0));
        assert_eq!(stored_count("0", -1, w), Some(0.0), "no expiry: older code");
        assert_eq!(
            stored_count("999999999999999", 1, w),
            Some(999_999_999_999_999.0)
        );
        for bad in [
            "012",
            "-1",
            "1.5",
            "1e3",
            " 1",
            "1 ",
            "inf",
            "9999999999999999",
            "",
        ] {
            assert_eq!(stored_count(bad, 1_000, w), None, "{bad:?}");
        }
        assert_eq!(
            stored_count("12", 60_001, w),
            None,
            "an expiry past the window"
        );
    }
}
