//! Concurrency: at most `max_in_flight` requests of a key in flight at once,
//! each slot taken when the request is admitted and given back when its
//! response is over, or at its deadline (`max_hold` after it was taken),
//! whichever is first. This file holds its arithmetic (room, and the
//! `Retry-After` estimate), its Lua (`lua/concurrency.lua`), its TTL rule
//! and the decoder of a stored set of slots.
//!
//! A request takes one slot whatever its cost; a refund gives none back
//! (the slot is released by id when the response ends, not by a count).

use std::time::Duration;

use super::LimitState;

macro_rules! lua {
    () => {
        include_str!("../../lua/concurrency.lua")
    };
}
pub(crate) use lua;

/// The live slots of a key at a time (any clock, seconds): how many, and
/// the earliest and latest deadline among them (NaN without slots).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Slots {
    pub(crate) count: f64,
    pub(crate) first: f64,
    pub(crate) last: f64,
}

impl Slots {
    pub(crate) const NONE: Self = Self {
        count: 0.0,
        first: f64::NAN,
        last: f64::NAN,
    };

    /// The summary of these deadlines (the live ones: after `now`).
    pub(crate) fn of(deadlines: impl Iterator<Item = f64>) -> Self {
        deadlines.fold(Self::NONE, |s, d| Self {
            count: s.count + 1.0,
            first: if s.first.is_nan() { d } else { s.first.min(d) },
            last: if s.last.is_nan() { d } else { s.last.max(d) },
        })
    }
}

/// One key at `now` (seconds), before and after taking a slot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Held {
    max: f64,
    hold: f64,
    now: f64,
    slots: Slots,
}

impl Held {
    /// `stored`: the key's live slots.
    pub(crate) fn read(max: f64, hold: Duration, stored: Option<Slots>, now: f64) -> Self {
        Self {
            max,
            hold: hold.as_secs_f64(),
            now,
            slots: stored.unwrap_or(Slots::NONE),
        }
    }

    /// Whether a slot is free: one, whatever the request's cost.
    pub(crate) fn fits(&self) -> bool {
        self.slots.count + 1.0 <= self.max
    }

    /// Takes a slot (`cost > 0`; a refund takes none); returns the slots
    /// after it and when the last of them is past its deadline.
    pub(crate) fn write(&mut self, cost: f64) -> (Slots, f64) {
        if cost > 0.0 {
            let deadline = self.now + self.hold;
            let s = &mut self.slots;
            s.count += 1.0;
            if s.first.is_nan() {
                s.first = deadline;
            }
            s.last = deadline;
        }
        let idle_at = if self.slots.count > 0.0 {
            self.slots.last
        } else {
            self.now
        };
        (self.slots, idle_at)
    }

    pub(crate) fn report(&self, enough: bool) -> LimitState {
        let s = self.slots;
        let (mut wait, mut reset) = (0.0, 0.0);
        if s.count > 0.0 {
            reset = s.last - self.now;
            if !enough {
                wait = retry_estimate(self.now - (s.first - self.hold), s.first - self.now);
            }
        }
        LimitState {
            enough,
            remaining: self.max - s.count,
            wait,
            reset,
            capacity: self.max,
        }
    }
}

/// Seconds until a slot is likely free, from the oldest slot's `age` and
/// the time `left` to its deadline: a request tends to hold about as long
/// again as the oldest one has already held, never past the oldest one's
/// deadline, and at least a second (the lua's `report` says the same).
pub(crate) fn retry_estimate(age: f64, left: f64) -> f64 {
    age.min(left).max(1.0)
}

/// The state of a key from the general script's answer for it: the slots
/// taken after the decision (−1 − that when none was free), then, in µs
/// from now, the latest deadline and, when none was free, the earliest.
pub(crate) fn script_answer(
    max: f64,
    max_hold: Duration,
    x: f64,
    last_us: f64,
    first_us: f64,
) -> LimitState {
    let enough = x >= 0.0;
    let count = if enough { x } else { -1.0 - x };
    let (mut wait, mut reset) = (0.0, 0.0);
    if count > 0.0 {
        reset = last_us / 1e6;
        if !enough {
            // In µs, as the script counts.
            let hold = max_hold.as_millis() as f64 * 1000.0;
            wait = retry_estimate((hold - first_us) / 1e6, first_us / 1e6);
        }
    }
    LimitState {
        enough,
        remaining: max - count,
        wait,
        reset,
        capacity: max,
    }
}

/// The longest a key lives: its last slot's deadline (the script's
/// `PEXPIRE` of `max_hold` + 1 ms).
pub(crate) fn max_ttl(max_hold: Duration) -> Duration {
    max_hold + Duration::from_millis(1)
}

/// The rule in words.
pub(crate) fn rule_text(max: f64, max_hold: Duration) -> String {
    format!(
        "at most {max} in flight, each slot held at most {}",
        super::duration_text(max_hold)
    )
}

/// The live slots of a stored set whose scores are `deadlines_us`, at
/// `now_us` on Redis's clock, as `lua/concurrency.lua` counts them: a slot
/// past its deadline is gone, one further than `max_hold` ahead was not
/// written by fleetlimit (or under an older, longer hold) and is dropped.
pub(crate) fn live_slots(
    deadlines_us: impl Iterator<Item = f64>,
    max_hold: Duration,
    now_us: f64,
) -> Slots {
    let last = now_us + max_hold.as_millis() as f64 * 1000.0;
    Slots::of(deadlines_us.filter(|&d| d > now_us && d <= last))
}

/// Live slots at `now_us`, for people.
pub(crate) fn reading(max: f64, slots: Slots, now_us: f64) -> super::Stored {
    let text = if slots.count == 0.0 {
        format!("no slot in flight, of {max}")
    } else {
        format!(
            "{} of {max} slots in flight, the next deadline in {:.3} s",
            slots.count,
            (slots.first - now_us) / 1e6
        )
    };
    super::Stored::Valid {
        remaining: (max - slots.count).max(0.0),
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_slot_per_request_and_an_estimate_from_the_oldest() {
        let hold = Duration::from_secs(30);
        let mut l = Held::read(2.0, hold, None, 100.0);
        assert!(l.fits());
        let (s, idle) = l.write(5.0);
        assert_eq!((s.count, s.first, idle), (1.0, 130.0, 130.0));
        // A slot taken at 100 s, read at 104 s with another taken at 103 s:
        // full; the oldest has held 4 s, so about 4 s more.
        let held = Slots::of([130.0, 133.0].into_iter());
        let l = Held::read(2.0, hold, Some(held), 104.0);
        assert!(!l.fits());
        let r = l.report(false);
        assert_eq!((r.remaining, r.wait, r.reset), (0.0, 4.0, 29.0));
        // Never past the oldest slot's deadline, never under a second.
        assert_eq!(retry_estimate(25.0, 5.0), 5.0);
        assert_eq!(retry_estimate(0.2, 29.8), 1.0);
        // A refund takes nothing.
        let mut l = Held::read(2.0, hold, None, 0.0);
        assert_eq!(l.write(-1.0).0.count, 0.0);
    }

    #[test]
    fn live_slots_are_those_the_script_counts() {
        let hold = Duration::from_secs(30);
        let now = 100e6;
        let s = live_slots([99e6, 100e6, 101e6, 130e6, 131e6].into_iter(), hold, now);
        assert_eq!((s.count, s.first, s.last), (2.0, 101e6, 130e6));
    }
}
