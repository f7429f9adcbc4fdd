//! `explain`'s report in words: the contract, the bucket now, and the
//! decisions as a support engineer pastes them.

use std::fmt;
use std::time::Duration;

use super::report::{Explanation, RecordedDecision, RegionShare};
use crate::admin::printable;
use crate::admin::time::format_time;
use crate::algorithm::{INVALID_STATE, Rule, Stored};

/// A number without trailing zeros (at most 3 decimals).
pub(super) fn num(x: f64) -> String {
    let s = format!("{x:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_owned()
}

fn secs(d: Duration) -> String {
    format!("{} s", num(d.as_secs_f64()))
}

/// The rule in a support engineer's words.
pub(super) fn contract(rule: &Rule) -> String {
    match *rule {
        Rule::TokenBucket {
            capacity,
            refill_per_sec,
        } => {
            let full_after = capacity / refill_per_sec;
            let five = capacity + 5.0 * refill_per_sec;
            format!(
                "token bucket: a burst of up to {cap} requests at once, then {rate} per second \
                 ({minute} per minute). An empty bucket is full again after {full} s. Over a \
                 long period that is {minute} per minute, but over a few seconds it is the \
                 burst that limits: in any 5 s at most {five} requests get through \
                 ({cap} + 5 s x {rate}/s), however far under {minute} the minute's total is.",
                cap = num(capacity),
                rate = num(refill_per_sec),
                minute = num(refill_per_sec * 60.0),
                full = num(full_after),
                five = num(five),
            )
        }
        Rule::FixedWindow { limit, window } => format!(
            "fixed window: at most {} requests per {}, the window opening with the \
             caller's first request",
            num(limit),
            secs(window)
        ),
        Rule::SlidingWindow { limit, window } => format!(
            "sliding window: about {} requests in any {} (the previous window's count \
             weighted by its overlap)",
            num(limit),
            secs(window)
        ),
        Rule::Concurrency {
            max_in_flight,
            max_hold,
        } => format!(
            "concurrency: at most {} requests in flight at once; a slot counts until the \
             response is over, or {} at most",
            num(max_in_flight),
            secs(max_hold)
        ),
    }
}

/// The stored value now, in words, by the limiter's own rules (`pttl`:
/// the key's `PTTL`; -2 no key; a key that exists without a string value
/// is of another type).
pub(super) fn state(rule: &Rule, raw: Option<&[u8]>, pttl: i64, now_us: f64) -> String {
    if rule.is_concurrency() {
        return "see `fleetlimit inspect` for the slots".into();
    }
    match (rule.read_stored(raw, pttl, now_us), raw) {
        (Stored::Valid { text, .. }, _) => text,
        (Stored::Absent, _) if pttl == -2 => "no key: a full bucket".into(),
        (Stored::Absent, _) => format!("a key of another type: {INVALID_STATE}"),
        (Stored::Invalid, raw) => {
            format!(
                "{INVALID_STATE}: {}",
                printable(&rule.shown(raw.unwrap_or_default()))
            )
        }
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plan = self
            .plan
            .as_deref()
            .unwrap_or("(none: the limit's own numbers)");
        writeln!(
            f,
            "limit {}, caller {}, plan {}",
            printable(&self.limit),
            printable(&self.key_id),
            printable(plan)
        )?;
        match &self.global {
            None => writeln!(f, "contract: {}", self.contract)?,
            Some(g) => {
                writeln!(f, "contract (the global policy): {}", self.contract)?;
                write_share(f, g)?;
            }
        }
        writeln!(f, "now: {}", self.state)?;
        let range = format!(
            "{} to {} (Redis clock)",
            format_time(self.from_ms),
            format_time(self.to_ms)
        );
        if !self.recording {
            return writeln!(
                f,
                "decisions: limit {} does not record them (set `record = true` on it)",
                printable(&self.limit)
            );
        }
        let refused = self.decisions.iter().filter(|d| !d.allowed).count();
        let degraded = self.decisions.iter().filter(|d| d.degraded).count();
        writeln!(
            f,
            "decisions {range}: {} recorded, {} admitted, {refused} refused, {degraded} degraded",
            self.decisions.len(),
            self.decisions.len() - refused,
        )?;
        // Runs of ordinary admissions are one line; every refusal and every
        // degraded decision is a line of its own.
        let mut run: Option<(&RecordedDecision, &RecordedDecision, usize)> = None;
        let mut suspicious = 0;
        let mut previous: Option<&RecordedDecision> = None;
        for d in &self.decisions {
            if d.allowed && !d.degraded {
                run = Some(match run {
                    Some((first, _, n)) => (first, d, n + 1),
                    None => (d, d, 1),
                });
                previous = Some(d);
                continue;
            }
            if let Some(r) = run.take() {
                write_run(f, r)?;
            }
            let by_another = !d.allowed && d.enough == Some(true);
            let what = match (d.allowed, d.via.as_str()) {
                (true, _) => "admitted",
                (false, "closed") => "REFUSED 503",
                (false, _) => "REFUSED 429",
            };
            let before = match previous.and_then(|p| p.remaining) {
                Some(n) => format!("previous answer: remaining {n}"),
                None => "previous answer: none recorded".into(),
            };
            write!(
                f,
                "  {}  {what:<11}  remaining {}  via {}",
                format_time(d.at_ms),
                show_remaining(d.remaining),
                printable(&d.via)
            )?;
            if d.degraded {
                write!(
                    f,
                    "  DEGRADED (Redis failed: decided by `{}`)",
                    printable(&d.via)
                )?;
            }
            if by_another {
                write!(f, "  (by another limit of the route; this one had room)")?;
            } else if !d.allowed {
                write!(f, "  ({before})")?;
                if previous.and_then(|p| p.remaining).is_some_and(|n| n > 0) {
                    suspicious += 1;
                    write!(
                        f,
                        "  <- CHECK: refused right after an answer with tokens left"
                    )?;
                }
            }
            writeln!(f, "  instance {}", printable(&d.instance))?;
            previous = Some(d);
        }
        if let Some(r) = run.take() {
            write_run(f, r)?;
        }
        if refused > 0 {
            if suspicious == 0 {
                writeln!(
                    f,
                    "every refusal followed an answer of remaining 0 (or none recorded): \
                     the limit did what its contract says"
                )?;
            } else {
                writeln!(
                    f,
                    "{suspicious} refusal(s) came right after an answer with tokens left: \
                     another instance or client sharing the key, a reset, a plan change, or a bug"
                )?;
            }
        }
        Ok(())
    }
}

/// The `scope:` line of a global limit.
fn write_share(f: &mut fmt::Formatter<'_>, g: &RegionShare) -> fmt::Result {
    let regions: Vec<String> = g.regions.iter().map(|r| printable(r)).collect();
    let region = printable(&g.region);
    write!(
        f,
        "scope: global, one limit across regions {}; region {region} decides this caller \
         against its share, {}% ({} ppm) of the limit: a burst of {}, then {} per second",
        regions.join(", "),
        num(g.percent),
        g.ppm,
        num(g.capacity),
        num(g.refill_per_sec),
    )?;
    match g.source {
        "split" => writeln!(f, " (none stored: the configured split)"),
        "unclaimed" => writeln!(
            f,
            " (none stored since region {region}'s Redis restarted: it holds none of this \
             caller's quota until its exchange claims it from the other regions' records)"
        ),
        "unreadable" => writeln!(
            f,
            " (its stored share {:?} is not a whole number of parts per million: the limiter \
             reads it as 0, so region {region} admits nothing of this caller until the exchange \
             writes it a share)",
            printable(g.stored.as_deref().unwrap_or(""))
        ),
        _ => writeln!(f, " (stored in region {region}'s Redis)"),
    }?;
    f.write_str(&crate::admin::quota::words(&g.flights, "  "))
}

fn show_remaining(r: Option<u64>) -> String {
    r.map_or_else(|| "?".into(), |n| n.to_string())
}

fn write_run(
    f: &mut fmt::Formatter<'_>,
    (first, last, n): (&RecordedDecision, &RecordedDecision, usize),
) -> fmt::Result {
    writeln!(
        f,
        "  {} .. {}  admitted x{n}  remaining {} -> {}",
        format_time(first.at_ms),
        format_time(last.at_ms),
        show_remaining(first.remaining),
        show_remaining(last.remaining),
    )
}
