//! Token bucket as GCRA, the one model both stores keep. This file holds
//! its arithmetic on the stored state, its Lua (`lua/token_bucket.lua`, the
//! core both scripts start with, then the lean driver or the general
//! steps), the lean script's arguments and answers, its TTL rule, and the
//! decoder of a stored state (admin tools).
//!
//! A bucket of `capacity` tokens refilling `refill_per_sec` is one number,
//! its theoretical arrival time (TAT) in µs: full when TAT ≤ now, holding
//! (burst − (TAT − now)) ÷ per tokens otherwise, where per = 10^6 ÷ refill
//! is the µs one token takes to refill and burst = capacity × per. Taking
//! `cost` tokens moves TAT by cost × per; a refund moves it back, never
//! before now (full). Redis keeps it on its clock (`TIME`), the in-process
//! store on its own.

use std::time::Duration;

use super::LimitState;

/// Slack, in µs of refill, added to a token bucket's burst when deciding.
/// Redis holds times in µs as doubles near 1.8 × 10^15, which step by ¼ µs
/// (½ µs from 2041): `now + burst` or `TAT + cost × per` is rounded to that
/// step, and a request that fits exactly (cost = capacity on a full bucket)
/// could be refused for ever when the rounding goes up. Half a µs covers a
/// rounding of either step; what it admits early is below Redis's 1 µs clock
/// resolution. The in-process store decides with the same numbers, so the
/// two stores agree (its own clock rounds far less).
pub(crate) const REDIS_SLACK_US: f64 = 0.5;

/// The core both scripts start with: the state rule (read, validity,
/// expiry) and the arithmetic on a stored TAT.
macro_rules! core {
    () => {
        include_str!("../../lua/token_bucket.lua")
    };
}
pub(crate) use core;

/// The general script's block for a token bucket (inside
/// `lua/decide.lua`'s loops, on the core's functions).
macro_rules! lua {
    () => {
        include_str!("../../lua/token_bucket_general.lua")
    };
}
pub(crate) use lua;

/// The lean script: single-token-bucket checks (most requests), one or
/// several per call (see `store/batch.rs`). The bucket's state, expiry and
/// arithmetic come from `lua/token_bucket.lua`; the driver after it only
/// reads the arguments [`LeanArgs`] prints and answers integers.
pub(crate) const LEAN: &str = concat!(core!(), include_str!("../../lua/token_bucket_lean.lua"));

/// The lean script for a Cluster's call across slots of one primary: the
/// same text, flagged so that Redis 7 lets it touch keys of several slots
/// (the flag must be its first line). Such a call declares no key and names
/// them in its arguments (see `lua/token_bucket_lean.lua`).
pub(crate) const LEAN_CROSS: &str = concat!(
    "#!lua flags=allow-cross-slot-keys\n",
    core!(),
    include_str!("../../lua/token_bucket_lean.lua")
);

/// The one-check script: a call carrying a single check (a lone request,
/// a batch of one) decided as the lean script decides it, with its numbers
/// as one argument of three doubles ([`LeanArgs::packed`]).
pub(crate) const ONE: &str = concat!(core!(), include_str!("../../lua/token_bucket_one.lua"));

/// The lease script: a hot key's partial lease (`src/pipeline/check/lease/`),
/// as many whole requests as are free up to a batch, on the same core.
pub(crate) const LEASE: &str = concat!(core!(), include_str!("../../lua/token_bucket_lease.lua"));

/// A token bucket in µs of its store's clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Gcra {
    capacity: f64,
    /// µs one token takes to refill (the emission interval).
    per: f64,
    /// µs a full bucket spans: capacity × per.
    burst: f64,
}

impl Gcra {
    pub(crate) fn new(capacity: f64, refill_per_sec: f64) -> Self {
        let per = 1_000_000.0 / refill_per_sec;
        Self {
            capacity,
            per,
            burst: capacity * per,
        }
    }

    /// The TAT a decision starts from: a missing or past TAT is a full bucket.
    pub(crate) fn start(stored: Option<f64>, now: f64) -> f64 {
        match stored {
            Some(tat) if tat > now => tat,
            _ => now,
        }
    }

    /// µs a charge of `cost` tokens moves the TAT by.
    pub(crate) fn inc(&self, cost: f64) -> f64 {
        cost * self.per
    }

    /// Whether taking `inc` µs from TAT `tat` fits the burst (and the slack).
    pub(crate) fn fits(&self, tat: f64, inc: f64, now: f64) -> bool {
        tat + inc - now <= self.burst + REDIS_SLACK_US
    }

    /// The TAT after taking `inc` µs (a refund never past full).
    pub(crate) fn after(tat: f64, inc: f64, now: f64) -> f64 {
        (tat + inc).max(now)
    }

    /// Tokens in a bucket whose TAT is `ahead` µs after now (below zero
    /// when a larger burst wrote it).
    pub(crate) fn tokens(&self, ahead: f64) -> f64 {
        (self.burst - ahead) / self.per
    }

    /// The state reported to clients, from TAT − now after the decision
    /// (after the charge when `enough`).
    pub(crate) fn report(&self, ahead: f64, inc: f64, enough: bool) -> LimitState {
        LimitState {
            enough,
            // Within the slack, TAT may pass the burst by a hair.
            remaining: self.tokens(ahead).max(0.0),
            // Until another `cost` fits, after this decision: as the general
            // script reports it (and the in-process store did before it kept
            // a TAT); only a refusal's is ever read by the layer.
            wait: ((ahead + inc - self.burst) / 1_000_000.0).max(0.0),
            reset: ahead / 1_000_000.0,
            capacity: self.capacity,
        }
    }
}

/// One bucket at `now` (µs), before and after a charge.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tokens {
    gcra: Gcra,
    tat: f64,
    now: f64,
}

impl Tokens {
    pub(crate) fn read(capacity: f64, refill_per_sec: f64, stored: Option<f64>, now: f64) -> Self {
        Self {
            gcra: Gcra::new(capacity, refill_per_sec),
            tat: Gcra::start(stored, now),
            now,
        }
    }

    #[cfg(test)]
    fn avail(&self) -> f64 {
        self.gcra.tokens(self.tat - self.now)
    }

    pub(crate) fn fits(&self, cost: f64) -> bool {
        self.gcra.fits(self.tat, self.gcra.inc(cost), self.now)
    }

    /// Charges `cost`; returns the new TAT, which is also when the bucket
    /// is full again (it may then be forgotten).
    pub(crate) fn write(&mut self, cost: f64) -> f64 {
        self.tat = Gcra::after(self.tat, self.gcra.inc(cost), self.now);
        self.tat
    }

    pub(crate) fn report(&self, cost: f64, enough: bool) -> LimitState {
        self.gcra
            .report(self.tat - self.now, self.gcra.inc(cost), enough)
    }
}

/// One check as the lean script sees it: what it costs and what a full
/// burst spans (with the slack), in µs. Computed here rather than in Lua:
/// the script does only what needs Redis (the clock, the read, the write).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LeanArgs {
    gcra: Gcra,
    inc: f64,
}

impl LeanArgs {
    pub(crate) fn new(capacity: f64, refill_per_sec: f64, cost: f64) -> Self {
        let gcra = Gcra::new(capacity, refill_per_sec);
        Self {
            gcra,
            inc: gcra.inc(cost),
        }
    }

    /// Whether this check takes tokens (not a refund, not free).
    pub(crate) fn charges(&self) -> bool {
        self.inc > 0.0
    }

    /// The check giving back what this one charges (`None`: a refund, or
    /// free, charges nothing).
    pub(crate) fn refund(&self) -> Option<Self> {
        self.charges().then_some(Self {
            inc: -self.inc,
            ..*self
        })
    }

    /// The script's two arguments: the charge, and what it compares
    /// TAT − now with (the burst and [`REDIS_SLACK_US`]).
    pub(crate) fn args(&self) -> (f64, f64) {
        (self.inc, self.gcra.burst + REDIS_SLACK_US)
    }

    /// The script's answer for this check: 4 × (TAT − now) in µs after the
    /// charge when admitted, −1 − 4 × (TAT − now) when refused.
    pub(crate) fn answer(&self, x: i64) -> LimitState {
        let enough = x >= 0;
        let ahead = (if enough { x } else { -1 - x }) as f64 / 4.0;
        self.gcra.report(ahead, self.inc, enough)
    }
}

/// A partial lease's answer (the lease script's, or the in-process
/// store's): what was taken, and the bucket after it.
impl LeanArgs {
    /// `taken` requests of this check's cost were leased, of at most
    /// `most`; TAT − now is `x` ÷ 4 µs after. The state's `wait` is the
    /// time until `most` requests fit again (when a whole lease could be
    /// taken), its `enough` whether anything was taken.
    pub(crate) fn lease_answer(&self, taken: i64, x: i64, most: f64) -> LimitState {
        let ahead = x as f64 / 4.0;
        let mut s = self.gcra.report(ahead, self.inc * most, taken > 0);
        s.remaining = s.remaining.min(self.gcra.capacity);
        s
    }
}

/// What the general script gets: the capacity carries [`REDIS_SLACK_US`] of
/// refill more, so it decides as the lean script does.
pub(crate) fn script_args(capacity: f64, refill_per_sec: f64) -> (f64, f64) {
    (
        capacity + REDIS_SLACK_US * refill_per_sec / 1_000_000.0,
        refill_per_sec,
    )
}

/// The state of a bucket from the general script's answer for it, which
/// is the lean script's (4 × (TAT − now) in quarter µs, −1 − that when the
/// cost did not fit): the two scripts decide alike.
pub(crate) fn script_answer(capacity: f64, refill_per_sec: f64, cost: f64, x: f64) -> LimitState {
    LeanArgs::new(capacity, refill_per_sec, cost).answer(x as i64)
}

/// The longest a key lives: until the bucket is full again, then to the
/// end of the next second (the scripts' `PXAT`).
pub(crate) fn max_ttl(capacity: f64, refill_per_sec: f64) -> Duration {
    Duration::from_secs_f64((capacity / refill_per_sec).min(1e9)) + Duration::from_secs(2)
}

/// The rule in words.
pub(crate) fn rule_text(capacity: f64, refill_per_sec: f64) -> String {
    format!(
        "token bucket of {capacity} refilled at {}",
        super::rate_text(refill_per_sec)
    )
}

/// How far ahead of now a stored TAT may be when the key's expiry vouches
/// for it (2^50 in `lua/token_bucket.lua`'s `tat_read`).
const FAR_US: f64 = 1_125_899_906_842_624.0; // 2^50

/// The TAT the scripts take the stored value `raw` for (`tat_read` in
/// `lua/token_bucket.lua`), at `now_us` on Redis's clock with the key's
/// `pttl_ms`: a finite number ([`stored_number`](super::stored_number)) at most a full
/// burst ahead of now, or further ahead (at most 2^50 µs) when the key's
/// expiry is no earlier than it. `None`: not a state fleetlimit wrote, which
/// the limiter takes as a full bucket.
pub(crate) fn stored_tat(
    raw: &[u8],
    pttl_ms: i64,
    capacity: f64,
    refill_per_sec: f64,
    now_us: f64,
) -> Option<f64> {
    let stored = super::stored_number(raw)?;
    if !stored.is_finite() {
        return None;
    }
    let burst = Gcra::new(capacity, refill_per_sec).burst + REDIS_SLACK_US;
    let ahead = stored - now_us;
    let vouched = ahead <= FAR_US && pttl_ms as f64 * 1000.0 >= ahead;
    (ahead <= burst || vouched).then_some(stored)
}

/// A valid TAT at `now_us`, for people.
pub(crate) fn reading(capacity: f64, refill_per_sec: f64, tat: f64, now_us: f64) -> super::Stored {
    let gcra = Gcra::new(capacity, refill_per_sec);
    let ahead = Gcra::start(Some(tat), now_us) - now_us;
    let tokens = gcra.tokens(ahead).clamp(0.0, capacity);
    let text = if ahead <= 0.0 {
        format!("{tokens:.2} of {capacity} tokens: full")
    } else {
        format!(
            "{tokens:.2} of {capacity} tokens, full in {} s",
            super::num(ahead / 1e6, 3)
        )
    };
    super::Stored::Valid {
        remaining: tokens,
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::super::Stored;
    use super::*;

    const S: f64 = 1e6;

    #[test]
    fn refill_is_capped_and_waits_are_exact() {
        let (cap, rate) = (5.0, 10.0);
        assert_eq!(Tokens::read(cap, rate, None, 100.0 * S).avail(), 5.0);
        // Emptied at t = 100 s: the TAT is a full burst (0.5 s) ahead.
        let empty = Some(100.5 * S);
        let l = Tokens::read(cap, rate, empty, 100.04 * S);
        assert!((l.avail() - 0.4).abs() < 1e-9);
        // The design document's example: 0.4 tokens, cost 1, 10/s → 0.06 s.
        assert!((l.report(1.0, false).wait - 0.06).abs() < 1e-9);
        assert_eq!(Tokens::read(cap, rate, empty, 200.0 * S).avail(), 5.0);
        // A refund never overfills.
        let mut l = Tokens::read(cap, rate, Some(100.1 * S), 100.0 * S);
        l.write(-3.0);
        assert_eq!(l.avail(), 5.0);
    }

    #[test]
    fn an_exact_fit_is_admitted() {
        // A third of a second per token, on a clock of Redis's magnitude.
        let l = Tokens::read(3.0, 3.0, None, 1.8e15);
        assert!(l.fits(3.0));
        assert!(!l.fits(4.0));
    }

    #[test]
    fn lean_answers_decode_to_the_limit_state() {
        // 5 tokens at 10/s: 100 ms per token, a burst spans 500 ms.
        let args = LeanArgs::new(5.0, 10.0, 1.0);
        assert_eq!(args.args(), (100_000.0, 500_000.5));
        // Admitted, TAT 300 ms ahead after the charge: 2 tokens left.
        let s = args.answer(4 * 300_000);
        assert!(s.enough);
        assert_eq!((s.remaining, s.reset, s.wait), (2.0, 0.3, 0.0));
        // Refused, TAT 450 ms ahead: half a token left, the next one in 50 ms.
        let s = args.answer(-1 - 4 * 450_000);
        assert!(!s.enough);
        assert!((s.remaining - 0.5).abs() < 1e-9);
        assert!((s.wait - 0.05).abs() < 1e-9);
        assert_eq!(s.reset, 0.45);
    }

    #[test]
    fn a_stored_tat_is_read_as_the_scripts_read_it() {
        let now = 1.8e15;
        // 5 tokens at 10/s: a burst spans 500 ms.
        let tat = |raw: &str, pttl| stored_tat(raw.as_bytes(), pttl, 5.0, 10.0, now);
        let bytes = |x: f64| stored_tat(&x.to_le_bytes(), -1, 5.0, 10.0, now);
        assert_eq!(bytes(now + 2e5), Some(now + 2e5), "as the scripts write it");
        assert_eq!(bytes(now + 2e5 + 0.25), Some(now + 2e5 + 0.25), "exactly");
        assert_eq!(bytes(f64::INFINITY), None);
        assert_eq!(bytes(now + 1e10), None, "beyond the burst, no expiry");
        assert_eq!(tat("1800000000200000", -1), Some(now + 2e5));
        assert_eq!(tat(" 1800000000200000\n", -1), Some(now + 2e5));
        assert_eq!(
            tat("0x66517289b8d40", -1),
            Some(now + 2e5),
            "hex, as tonumber"
        );
        assert_eq!(tat("1800000000200000\0junk", -1), Some(now + 2e5));
        assert_eq!(tat("5", -1), Some(5.0), "in the past: a full bucket");
        // Beyond the burst: only with an expiry that vouches for it.
        assert_eq!(tat("1800010000000000", -1), None);
        assert_eq!(tat("1800010000000000", 10_000_000), Some(now + 1e10));
        assert_eq!(tat("1800010000000000", 9_999_999), None);
        for bad in [
            "inf",
            "-inf",
            "nan",
            "1e400",
            "99999999999999999999999",
            "x",
            "",
            "1e",
            "0x",
        ] {
            assert_eq!(tat(bad, i64::MAX / 1000), None, "{bad:?}");
        }
        let full = reading(5.0, 10.0, now - 1.0, now);
        assert_eq!(
            full,
            super::super::Stored::Valid {
                remaining: 5.0,
                text: "5.00 of 5 tokens: full".into()
            }
        );
        let Stored::Valid { remaining, text } = reading(5.0, 10.0, now + 2e5, now) else {
            unreachable!()
        };
        assert_eq!(
            (remaining, text.as_str()),
            (3.0, "3.00 of 5 tokens, full in 0.2 s")
        );
    }
}
