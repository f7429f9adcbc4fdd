//! The way people write rates and durations: `"10/s"`, `"600/min"`, `"5ms"`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::ConfigError;
use crate::algorithm::fmt_duration;

/// A refill rate: `amount` tokens every `per`.
///
/// Written as `"<amount>/<period>"`, where the period is a unit (`s`, `min`,
/// `h`, `d`) optionally preceded by a count: `"10/s"`, `"600/min"`,
/// `"3/min"`, `"100/15min"`, `"1000/h"`.
///
/// ```
/// use std::time::Duration;
/// use fleetlimit::configuration::Rate;
///
/// let rate: Rate = "100/15min".parse()?;
/// assert_eq!(rate, Rate::new(100, Duration::from_secs(900)));
/// assert_eq!(Rate::per_minute(60).tokens_per_second(), 1.0);
/// assert_eq!(Rate::per_hour(3600).tokens_per_second(), 1.0);
/// assert_eq!(Rate::per_day(86_400).tokens_per_second(), 1.0);
/// // Not a rate: a `ConfigError` that says why.
/// let err = "ten per second".parse::<Rate>().unwrap_err();
/// assert!(err.to_string().contains("no '/'"));
/// # Ok::<(), fleetlimit::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    amount: f64,
    per: Duration,
}

impl Rate {
    /// `amount` tokens every `per`: `Rate::new(100, Duration::from_secs(900))`
    /// is 100 every 15 minutes. Panics if either is zero; use
    /// [`Rate::from_str`] for untrusted input (it also takes fractions,
    /// `"0.5/s"`).
    #[must_use]
    pub fn new(amount: u64, per: Duration) -> Self {
        assert!(
            amount > 0 && !per.is_zero(),
            "a rate needs a positive amount and a non-zero period"
        );
        Self {
            amount: amount as f64,
            per,
        }
    }

    /// `n` tokens a second.
    #[must_use]
    pub fn per_second(n: u64) -> Self {
        Self::new(n, Duration::from_secs(1))
    }

    /// `n` tokens a minute.
    #[must_use]
    pub fn per_minute(n: u64) -> Self {
        Self::new(n, Duration::from_secs(60))
    }

    /// `n` tokens an hour.
    #[must_use]
    pub fn per_hour(n: u64) -> Self {
        Self::new(n, Duration::from_secs(3600))
    }

    /// `n` tokens a day.
    #[must_use]
    pub fn per_day(n: u64) -> Self {
        Self::new(n, Duration::from_secs(86_400))
    }

    /// Tokens added per second.
    #[must_use]
    pub fn tokens_per_second(&self) -> f64 {
        self.amount / self.per.as_secs_f64()
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.amount, fmt_duration(self.per))
    }
}

/// Why a rate or duration string did not parse (public as the
/// [`ConfigError`] of [`Rate`]'s `FromStr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ParseUnitError(String);

impl From<ParseUnitError> for ConfigError {
    fn from(e: ParseUnitError) -> Self {
        ConfigError::new(e.0)
    }
}

impl fmt::Display for ParseUnitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseUnitError {}

impl FromStr for Rate {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s).map_err(ConfigError::from)
    }
}

impl Rate {
    /// [`FromStr`], with the crate's own error.
    pub(crate) fn parse(s: &str) -> Result<Self, ParseUnitError> {
        let bad = |why: &str| {
            ParseUnitError(format!(
                "invalid rate {s:?}: {why} (write it like \"10/s\", \"600/min\" or \"100/15min\")"
            ))
        };
        let (amount, period) = s.split_once('/').ok_or_else(|| bad("no '/'"))?;
        let amount: f64 = amount
            .trim()
            .parse()
            .map_err(|_| bad("the amount is not a number"))?;
        if !(amount.is_finite() && amount > 0.0) {
            return Err(bad("the amount must be greater than zero"));
        }
        let period = period.trim();
        // "600/min" means one minute; "100/15min" means fifteen.
        let per = if period.starts_with(|c: char| c.is_ascii_digit()) {
            parse_duration(period).map_err(|e| bad(&e.0))?
        } else {
            unit(period).ok_or_else(|| {
                bad(&format!(
                    "unknown time unit {period:?}; expected s, min, h or d"
                ))
            })?
        };
        if per.is_zero() {
            return Err(bad("the period must be longer than zero"));
        }
        Ok(Self { amount, per })
    }
}

fn unit(u: &str) -> Option<Duration> {
    Some(match u {
        "ms" | "millisecond" | "milliseconds" => Duration::from_millis(1),
        "s" | "sec" | "secs" | "second" | "seconds" => Duration::from_secs(1),
        "m" | "min" | "mins" | "minute" | "minutes" => Duration::from_secs(60),
        "h" | "hr" | "hour" | "hours" => Duration::from_secs(3600),
        "d" | "day" | "days" => Duration::from_secs(86_400),
        _ => return None,
    })
}

/// Parses a duration the way the configuration writes one: a number and a
/// unit, `ms`, `s`, `min` (or `m`), `h` or `d`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, ParseUnitError> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| {
            ParseUnitError(format!(
                "invalid duration {s:?}: no unit (write it like \"5ms\" or \"60s\")"
            ))
        })?;
    let (num, u) = s.split_at(split);
    let num: f64 = num
        .parse()
        .map_err(|_| ParseUnitError(format!("invalid duration {s:?}: {num:?} is not a number")))?;
    let u = unit(u.trim()).ok_or_else(|| {
        ParseUnitError(format!(
            "invalid duration {s:?}: unknown unit {:?}; expected ms, s, min, h or d",
            u.trim()
        ))
    })?;
    let d = u.as_secs_f64() * num;
    if !d.is_finite() || d > MAX_DURATION_SECS as f64 {
        return Err(ParseUnitError(format!("invalid duration {s:?}: too long")));
    }
    Ok(Duration::from_secs_f64(d))
}

/// A duration as the configuration writes it, the inverse of
/// [`parse_duration`]: in the largest unit it is a whole number of.
#[must_use]
#[cfg(any(test, feature = "cli"))]
pub(crate) fn format_duration(d: Duration) -> String {
    crate::algorithm::duration_text(d)
}

/// The longest duration a configuration may give (about 31 years).
pub(super) const MAX_DURATION_SECS: u64 = 1_000_000_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_and_written_as_the_configuration_does() {
        assert_eq!(parse_duration("5ms"), Ok(Duration::from_millis(5)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("15min"), Ok(Duration::from_secs(900)));
        assert!(parse_duration("5").is_err());
        assert_eq!(format_duration(Duration::from_millis(1)), "1ms");
        assert_eq!(format_duration(Duration::from_secs(900)), "15min");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn rates_people_write() {
        assert_eq!("10/s".parse::<Rate>().unwrap().tokens_per_second(), 10.0);
        assert_eq!("600/min".parse::<Rate>().unwrap().tokens_per_second(), 10.0);
        assert_eq!("3/min".parse::<Rate>().unwrap().tokens_per_second(), 0.05);
        assert_eq!(
            "100/15min".parse::<Rate>().unwrap().tokens_per_second(),
            100.0 / 900.0
        );
        assert_eq!("3600 / h".parse::<Rate>().unwrap().tokens_per_second(), 1.0);
        assert_eq!("1/s".parse::<Rate>().unwrap().to_string(), "1/s");
        assert_eq!("600/min".parse::<Rate>().unwrap().to_string(), "600/min");
    }

    #[test]
    fn bad_rates_say_why() {
        let e = "10/fortnight".parse::<Rate>().unwrap_err().to_string();
        assert!(e.contains("unknown time unit \"fortnight\""), "{e}");
        assert!("ten/s".parse::<Rate>().is_err());
        assert!("0/s".parse::<Rate>().is_err());
        assert!("-1/s".parse::<Rate>().is_err());
        assert!("10".parse::<Rate>().is_err());
        assert!("10/0s".parse::<Rate>().is_err());
        assert!("NaN/s".parse::<Rate>().is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5ms").unwrap(), Duration::from_millis(5));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2min").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert_eq!(fmt_duration(Duration::from_millis(5)), "5ms");
    }

    // The removed `ParseUnitError` example, and its text kept by the
    // `ConfigError` that `Rate`'s `FromStr` answers.
    #[test]
    fn a_rate_without_a_slash_says_so() {
        let e = Rate::parse("ten per second").unwrap_err();
        assert!(e.to_string().contains("no '/'"), "{e}");
        let c = "ten per second".parse::<Rate>().unwrap_err();
        assert_eq!(c.message(), e.to_string());
    }

    // The removed `parse_duration` example, as a round trip: what
    // `format_duration` writes reads back as the same duration.
    #[test]
    fn written_durations_read_back_the_same() {
        for d in [
            Duration::from_millis(1),
            Duration::from_millis(5),
            Duration::from_millis(1500),
            Duration::from_secs(1),
            Duration::from_secs(90),
            Duration::from_secs(900),
            Duration::from_secs(7200),
            Duration::from_secs(86_400),
        ] {
            let text = format_duration(d);
            assert_eq!(parse_duration(&text), Ok(d), "{text}");
        }
    }

    // The removed `format_duration` example, the other way: a duration
    // written in its largest whole unit is written back as it was.
    #[test]
    fn durations_in_whole_units_are_written_back_as_read() {
        for text in ["1ms", "5ms", "1500ms", "15min"] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
    }
}
