//! The rate-limit algorithms, one file each (its arithmetic, its Lua, its
//! TTL rule, the decoder of its stored state), and what they share: the
//! [`Rule`] a limit applies, the [`State`] a key keeps, one key's [`Level`]
//! read at a time, the [`LimitState`] reported, and the all-or-nothing
//! decision of one request over its limits ([`decide`]).
//!
//! The in-process store runs the Rust half; Redis runs `lua/`, in the same
//! steps — `read` (state now, and how much room there is), `write` (charge a
//! cost, or refund a negative one) — on the same state: a token bucket's
//! GCRA arrival time, a window's count. The scripts answer that state as
//! integers, and the Rust half's `report` (remaining, wait, reset) reads it
//! (`Rule::script_answer`), so nothing is formatted in Lua.

mod concurrency;
mod fixed_window;
mod sliding_window;
mod token_bucket;

use std::time::Duration;

pub(crate) use concurrency::Slots;
pub(crate) use token_bucket::{LEAN, LEAN_CROSS, LEASE, LeanArgs, ONE};

mod level;
mod stored;
mod text;

pub(crate) use self::level::{Level, LimitCheck, decide};
pub(crate) use self::stored::*;
pub(crate) use self::text::{duration_text, fmt_duration, num, rate_text};

/// The general script, run by `EVALSHA`: the token bucket's core, then the
/// driver that decides every limit of a request at once, its loops holding
/// one block per algorithm (Redis runs the whole text on every call: blocks
/// cost nothing when unused, where functions and tables would be built).
pub(crate) const SCRIPT: &str = concat!(
    token_bucket::core!(),
    include_str!("../../lua/decide.lua"),
    token_bucket::lua!(),
    fixed_window::lua!(),
    sliding_window::lua!(),
    concurrency::lua!(),
    include_str!("../../lua/decide_end.lua"),
);

/// One bucket's state after a decision (see
/// [`Check`](crate::store::Check) for a whole round).
///
/// ```
/// use fleetlimit::store::LimitState;
///
/// let s = LimitState { enough: true, remaining: 3.5, wait: 0.0, reset: 6.5, capacity: 10.0 };
/// // What `X-RateLimit-Remaining` says of it: whole requests of the
/// // route's cost (1 here).
/// assert_eq!(s.remaining.floor(), 3.0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LimitState {
    /// This limit had room for the cost (and was charged if the request was
    /// admitted).
    pub enough: bool,
    /// Room left (fractional): tokens, or the window's limit minus its count.
    pub remaining: f64,
    /// Seconds until this limit has room for the request's cost; `0` when it
    /// already has.
    pub wait: f64,
    /// Seconds until this limit is back to full (empty window).
    pub reset: f64,
    /// The limit's capacity (burst, or the window's limit).
    pub capacity: f64,
}

/// One limit's rule, as the stores apply it.
///
/// ```
/// use std::time::Duration;
/// use fleetlimit::store::Rule;
///
/// let bucket = Rule::TokenBucket { capacity: 50.0, refill_per_sec: 10.0 };
/// let daily = Rule::FixedWindow { limit: 1000.0, window: Duration::from_secs(86_400) };
/// let in_flight = Rule::Concurrency { max_in_flight: 5.0, max_hold: Duration::from_secs(60) };
/// assert_eq!(bucket.capacity(), 50.0);
/// assert_eq!(daily.capacity(), 1000.0);
/// assert!(in_flight.is_concurrency());
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// Capacity (burst) and refill rate.
    TokenBucket {
        /// Tokens a full bucket holds.
        capacity: f64,
        /// Tokens added per second.
        refill_per_sec: f64,
    },
    /// At most `limit` per window, the window opening with the first request.
    FixedWindow {
        /// Requests (cost units) per window.
        limit: f64,
        /// The window's length.
        window: Duration,
    },
    /// At most about `limit` per sliding window (two weighted counters).
    SlidingWindow {
        /// Requests (cost units) per window.
        limit: f64,
        /// The window's length.
        window: Duration,
    },
    /// At most `max_in_flight` requests of a key in flight at once, each
    /// slot held until its response is over or for `max_hold` at most. A
    /// request takes one slot whatever its cost.
    Concurrency {
        /// Slots (requests in flight) per key.
        max_in_flight: f64,
        /// The longest a slot counts (an instance that dies holding it).
        max_hold: Duration,
    },
}

impl Rule {
    /// The most a key can ever spend at once: the bucket's capacity or the
    /// window's limit (`X-RateLimit-Limit` says it in requests of the
    /// route's cost).
    #[must_use]
    pub fn capacity(&self) -> f64 {
        match *self {
            Self::TokenBucket { capacity, .. } => capacity,
            Self::FixedWindow { limit, .. } | Self::SlidingWindow { limit, .. } => limit,
            Self::Concurrency { max_in_flight, .. } => max_in_flight,
        }
    }

    /// Whether this is a concurrency limit: one slot per request whatever
    /// its cost, given back by id when the response is over.
    #[must_use]
    pub fn is_concurrency(&self) -> bool {
        matches!(self, Self::Concurrency { .. })
    }

    /// How long a charge of this rule still weighs on its key: a token
    /// bucket's full refill, a fixed window, two sliding windows; `None`
    /// for a concurrency limit (nothing is consumed).
    pub(crate) fn horizon(&self) -> Option<Duration> {
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => Some(Duration::from_secs_f64(
                (capacity / refill_per_sec).min(86_400.0 * 366.0 * 10.0),
            )),
            Self::FixedWindow { window, .. } => Some(window),
            Self::SlidingWindow { window, .. } => Some(window * 2),
            Self::Concurrency { .. } => None,
        }
    }

    /// Units a decision admits beyond the remaining it reports: a token
    /// bucket's [`REDIS_SLACK_US`](token_bucket::REDIS_SLACK_US) of refill.
    /// A count of whole requests adds it, so that it counts what the
    /// stores admit (7 tokens left read back as 6.999999 are 7 requests).
    pub(crate) fn slack(&self) -> f64 {
        match *self {
            Self::TokenBucket { refill_per_sec, .. } => {
                token_bucket::REDIS_SLACK_US * refill_per_sec / 1_000_000.0
            }
            _ => 0.0,
        }
    }

    /// This rule's share for one of `n` instances (the `local` fallback).
    #[must_use]
    pub(crate) fn share(&self, n: u32) -> Self {
        let n = f64::from(n.max(1));
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => Self::TokenBucket {
                capacity: capacity / n,
                refill_per_sec: refill_per_sec / n,
            },
            Self::FixedWindow { limit, window } => Self::FixedWindow {
                limit: limit / n,
                window,
            },
            Self::SlidingWindow { limit, window } => Self::SlidingWindow {
                limit: limit / n,
                window,
            },
            // Whole slots: floored, and at least one.
            Self::Concurrency {
                max_in_flight,
                max_hold,
            } => Self::Concurrency {
                max_in_flight: (max_in_flight / n).floor().max(1.0),
                max_hold,
            },
        }
    }

    /// The general script's code and two parameters.
    pub(crate) fn script_args(&self) -> (&'static str, f64, f64) {
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => {
                let (p1, p2) = token_bucket::script_args(capacity, refill_per_sec);
                ("t", p1, p2)
            }
            Self::FixedWindow { limit, window } => ("f", limit, window.as_millis() as f64),
            Self::SlidingWindow { limit, window } => ("s", limit, window.as_millis() as f64),
            Self::Concurrency {
                max_in_flight,
                max_hold,
            } => ("c", max_in_flight, max_hold.as_millis() as f64),
        }
    }

    /// How many numbers the general script answers for a limit of this rule.
    pub(crate) fn reply_len(&self) -> usize {
        match self {
            Self::TokenBucket { .. } => 1,
            Self::FixedWindow { .. } => 2,
            Self::SlidingWindow { .. } | Self::Concurrency { .. } => 3,
        }
    }

    /// The limit's state from the general script's numbers for it
    /// ([`reply_len`](Self::reply_len) of them), for a check of `cost`.
    pub(crate) fn script_answer(&self, cost: f64, x: &[f64]) -> LimitState {
        let at = |i: usize| x.get(i).copied().unwrap_or(0.0);
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => token_bucket::script_answer(capacity, refill_per_sec, cost, at(0)),
            Self::FixedWindow { limit, .. } => {
                fixed_window::script_answer(limit, cost, at(0), at(1))
            }
            Self::SlidingWindow { limit, window } => {
                sliding_window::script_answer(limit, window, cost, at(0), at(1), at(2))
            }
            Self::Concurrency {
                max_in_flight,
                max_hold,
            } => concurrency::script_answer(max_in_flight, max_hold, at(0), at(1), at(2)),
        }
    }

    /// When the window a charge went into ends, on Redis's clock (µs), from
    /// the general script's numbers for it, answered at `now_us`: the last
    /// moment a refund of that charge still reaches the same window. `None`
    /// for a limit of no windows (a refund is the same at any time).
    pub(crate) fn window_end(&self, now_us: i64, x: &[f64]) -> Option<i64> {
        let at = |i: usize| x.get(i).copied().unwrap_or(0.0);
        match *self {
            Self::FixedWindow { .. } => fixed_window::window_end(now_us, at(1)),
            Self::SlidingWindow { window, .. } => {
                Some(sliding_window::window_end(window, now_us, at(0)))
            }
            Self::TokenBucket { .. } | Self::Concurrency { .. } => None,
        }
    }

    /// The lean script's arguments; `None` for anything but a token bucket
    /// (the general script's work).
    pub(crate) fn lean_args(&self, cost: f64) -> Option<LeanArgs> {
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => Some(LeanArgs::new(capacity, refill_per_sec, cost)),
            _ => None,
        }
    }

    /// The longest the scripts let a key of this rule live.
    pub(crate) fn max_ttl(&self) -> Duration {
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => token_bucket::max_ttl(capacity, refill_per_sec),
            Self::FixedWindow { window, .. } => fixed_window::max_ttl(window),
            Self::SlidingWindow { window, .. } => sliding_window::max_ttl(window),
            Self::Concurrency { max_hold, .. } => concurrency::max_ttl(max_hold),
        }
    }

    /// The rule in words, as `describe` and `fleetlimit` print it.
    pub(crate) fn describe(&self) -> String {
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => token_bucket::rule_text(capacity, refill_per_sec),
            Self::FixedWindow { limit, window } => fixed_window::rule_text(limit, window),
            Self::SlidingWindow { limit, window } => sliding_window::rule_text(limit, window),
            Self::Concurrency {
                max_in_flight,
                max_hold,
            } => concurrency::rule_text(max_in_flight, max_hold),
        }
    }

    /// What the limiter makes of a key holding the string `raw` (`None`:
    /// no key, or a key of another type, which the scripts' `MGET` reads
    /// alike) with `pttl_ms` (Redis `PTTL`) at `now_us` on Redis's clock,
    /// by the scripts' own validity rules (one function per algorithm, the
    /// same ones `tests/validity.rs` holds against the Lua): for the admin
    /// tools, which must never show a state the limiter does not act on.
    /// A concurrency limit keeps a sorted set: see
    /// [`read_slots`](Self::read_slots).
    pub(crate) fn read_stored(&self, raw: Option<&[u8]>, pttl_ms: i64, now_us: f64) -> Stored {
        let Some(raw) = raw else {
            return Stored::Absent;
        };
        // The windows' states are text, which Lua reads byte by byte: bytes
        // that are not UTF-8 are no number either way.
        let text = || String::from_utf8_lossy(raw);
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => token_bucket::stored_tat(raw, pttl_ms, capacity, refill_per_sec, now_us)
                .map_or(Stored::Invalid, |tat| {
                    token_bucket::reading(capacity, refill_per_sec, tat, now_us)
                }),
            Self::FixedWindow { limit, window } => {
                fixed_window::stored_count(&text(), pttl_ms, window)
                    .map_or(Stored::Invalid, |count| {
                        fixed_window::reading(limit, count, pttl_ms)
                    })
            }
            Self::SlidingWindow { limit, window } => {
                sliding_window::stored_windows(&text(), window, now_us)
                    .map_or(Stored::Invalid, |state| {
                        sliding_window::reading(limit, window, state, now_us)
                    })
            }
            // A string where a sorted set belongs: deleted at the next check.
            Self::Concurrency { .. } => Stored::Invalid,
        }
    }

    /// A stored value for people: a token bucket's TAT in µs of Redis's
    /// clock (as decimal text, whichever format holds it), anything else as
    /// its text (bytes that are not UTF-8 replaced).
    pub(crate) fn shown(&self, raw: &[u8]) -> String {
        match (self, <[u8; 8]>::try_from(raw)) {
            (Self::TokenBucket { .. }, Ok(bytes)) => f64::from_le_bytes(bytes).to_string(),
            _ => String::from_utf8_lossy(raw).into_owned(),
        }
    }

    /// What the limiter makes of a concurrency limit's sorted set, given
    /// its scores (`None`: no key): the live slots, as `lua/concurrency.lua`
    /// counts them. A score that is not a number makes the set not
    /// fleetlimit's.
    pub(crate) fn read_slots(&self, scores: Option<&[String]>, now_us: f64) -> Stored {
        let Self::Concurrency {
            max_in_flight,
            max_hold,
        } = *self
        else {
            return Stored::Invalid;
        };
        let Some(scores) = scores else {
            return Stored::Absent;
        };
        let Ok(deadlines) = scores
            .iter()
            .map(|s| s.parse::<f64>())
            .collect::<Result<Vec<_>, _>>()
        else {
            return Stored::Invalid;
        };
        let slots = concurrency::live_slots(deadlines.into_iter(), max_hold, now_us);
        concurrency::reading(max_in_flight, slots, now_us)
    }
}

/// What the in-process store keeps per key: the same as Redis, on the
/// store's own clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum State {
    /// A token bucket's TAT, in µs.
    Tat(f64),
    /// A fixed window's count, and when it closes (seconds).
    Fixed { count: f64, ends: f64 },
    /// A sliding window's index, its count and the previous window's.
    Sliding { idx: f64, curr: f64, prev: f64 },
    /// A concurrency limit's live slots (the in-process store keeps the
    /// slots themselves beside it, to release them by id).
    Slots(Slots),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the admin tools read from a stored value, per algorithm.
    #[test]
    fn stored_values_as_the_limiter_takes_them() {
        let now = 1_000.0 * 1e6;
        let tb = Rule::TokenBucket {
            capacity: 10.0,
            refill_per_sec: 1.0,
        };
        let left = |r: &Rule, raw: Option<&str>, pttl| {
            r.read_stored(raw.map(str::as_bytes), pttl, now)
                .remaining(r.capacity())
        };
        assert_eq!(
            tb.read_stored(None, -2, now),
            Stored::Absent,
            "no key: full"
        );
        assert_eq!(left(&tb, None, -2), 10.0);
        // The TAT 4 s ahead: 4 of 10 tokens spent.
        let tat = (now + 4e6).to_string();
        assert_eq!(left(&tb, Some(&tat), 5_000), 6.0);
        let past = (now - 1e6).to_string();
        assert_eq!(left(&tb, Some(&past), -1), 10.0);
        // The same TAT as the scripts write it now: 8 bytes.
        let bytes = (now + 4e6).to_le_bytes();
        assert_eq!(
            tb.read_stored(Some(&bytes), 5_000, now).remaining(10.0),
            6.0
        );
        assert_eq!(tb.shown(&bytes), "1004000000");
        assert_eq!(tb.shown(tat.as_bytes()), "1004000000");
        for bad in ["x", "inf", "1e400", "99999999999999999999999"] {
            assert_eq!(
                tb.read_stored(Some(bad.as_bytes()), -1, now),
                Stored::Invalid,
                "{bad}"
            );
        }
        let nan = f64::NAN.to_le_bytes();
        assert_eq!(tb.read_stored(Some(&nan), -1, now), Stored::Invalid);
        let fw = Rule::FixedWindow {
            limit: 100.0,
            window: Duration::from_secs(60),
        };
        assert_eq!(left(&fw, Some("12"), 1_000), 88.0);
        assert_eq!(left(&fw, Some("120"), 1_000), 0.0, "never below 0");
        assert_eq!(fw.read_stored(Some(b"1e400"), 1_000, now), Stored::Invalid);
        // A window's count is text, 8 bytes long or not.
        assert_eq!(
            left(&fw, Some("00000012"), 1_000),
            100.0,
            "not a count it writes"
        );
        assert_eq!(fw.shown(b"12345678"), "12345678");
        let sw = Rule::SlidingWindow {
            limit: 10.0,
            window: Duration::from_secs(10),
        };
        // At t = 1000 s, window 100 just opened: the previous one weighs all.
        assert_eq!(left(&sw, Some("100 0 4"), 1_000), 6.0);
        assert_eq!(left(&sw, Some("99 4 0"), 1_000), 6.0);
        assert_eq!(sw.read_stored(Some(b"1 2"), 1_000, now), Stored::Invalid);
        let c = Rule::Concurrency {
            max_in_flight: 3.0,
            max_hold: Duration::from_secs(30),
        };
        assert_eq!(c.read_stored(Some(b"x"), -1, now), Stored::Invalid);
        let scores = vec![(now + 1e6).to_string(), "oops".to_owned()];
        assert_eq!(c.read_slots(Some(&scores), now), Stored::Invalid);
        let scores = vec![(now + 1e6).to_string()];
        assert_eq!(c.read_slots(Some(&scores), now).remaining(3.0), 2.0);
    }

    /// Lua 5.1's `tonumber`, as the scripts read stored values.
    #[test]
    fn numbers_as_lua_reads_them() {
        let cases: [(&str, Option<f64>); 16] = [
            ("12", Some(12.0)),
            ("  12\t\n", Some(12.0)),
            ("-1.5e3", Some(-1500.0)),
            (".5", Some(0.5)),
            ("5.", Some(5.0)),
            ("0x1A", Some(26.0)),
            ("0x1.8p1", Some(3.0)),
            ("-0X10", Some(-16.0)),
            ("12\0trailing", Some(12.0)),
            ("1e", None),
            ("0x", None),
            ("1 2", None),
            ("", None),
            ("abc", None),
            ("1_000", None),
            ("+", None),
        ];
        for (raw, want) in cases {
            assert_eq!(lua_number(raw), want, "{raw:?}");
        }
        assert_eq!(lua_number("inf"), Some(f64::INFINITY));
        assert_eq!(lua_number("-Infinity"), Some(f64::NEG_INFINITY));
        assert!(lua_number("nan").is_some_and(f64::is_nan));
        assert_eq!(lua_number("1e400"), Some(f64::INFINITY));
    }

    #[test]
    fn rates_and_durations_as_the_file_writes_them() {
        assert_eq!(rate_text(1.0 / 60.0), "1/min");
        assert_eq!(rate_text(100.0 / 900.0), "400/h");
        assert_eq!(rate_text(0.5), "30/min");
        assert_eq!(rate_text(10.0), "10/s");
        assert_eq!(rate_text(1.0 / 86_400.0), "1/d");
        assert_eq!(rate_text(1e-6), "0.000001/s");
        assert_eq!(duration_text(Duration::from_millis(1)), "1ms");
        assert_eq!(duration_text(Duration::from_secs(900)), "15min");
        assert_eq!(duration_text(Duration::from_millis(1500)), "1500ms");
        assert_eq!(duration_text(Duration::from_micros(500)), "0.5ms");
        assert_eq!(duration_text(Duration::ZERO), "0s");
        assert_eq!(fmt_duration(Duration::from_secs(60)), "min");
        assert_eq!(fmt_duration(Duration::from_secs(7200)), "2h");
        for d in [1, 999, 1000, 1500, 60_000, 5_400_000] {
            let d = Duration::from_millis(d);
            assert_eq!(crate::config::parse_duration(&duration_text(d)).unwrap(), d);
        }
    }

    #[test]
    fn all_or_nothing_and_shadow_limits() {
        let tb = |capacity| Rule::TokenBucket {
            capacity,
            refill_per_sec: 1.0,
        };
        let at = Duration::from_secs(1);
        let read = |capacity, shadow| LimitCheck::new(Level::read(tb(capacity), None, at), shadow);
        // The second limit lacks room: neither is charged.
        let mut limits = [read(5.0, false), read(1.0, false)];
        assert!(!decide(&mut limits, 2.0));
        assert!(limits.iter().all(|l| l.charged.is_none()));
        assert_eq!(limits[0].report(2.0).remaining, 5.0);
        // In shadow mode it never refuses, and only the one with room pays.
        let mut limits = [read(5.0, false), read(1.0, true)];
        assert!(decide(&mut limits, 2.0));
        assert!(limits[0].charged.is_some() && limits[1].charged.is_none());
        assert_eq!(limits[0].report(2.0).remaining, 3.0);
        assert!(!limits[1].report(2.0).enough);
        // A refund always has room.
        let mut limits = [read(1.0, false)];
        assert!(decide(&mut limits, -1.0));
    }
}
