//! Durations and rates as a configuration writes them (`90s`, `1/min`),
//! for messages a person reads.

use std::time::Duration;

/// A duration as a configuration writes it: `"5ms"`, `"90s"`, `"15min"`,
/// `"min"` (a bare unit for exactly one of it, as in a rate's `"10/min"`).
pub(crate) fn fmt_duration(d: Duration) -> String {
    match d.as_nanos() {
        1_000_000_000 => "s".into(),
        60_000_000_000 => "min".into(),
        3_600_000_000_000 => "h".into(),
        86_400_000_000_000 => "d".into(),
        _ => duration_text(d),
    }
}

/// A duration in the largest unit of the configuration's (`d`, `h`, `min`,
/// `s`, `ms`) it is a whole number of, else in ms with a fraction: the
/// text `config::parse_duration` reads back.
pub(crate) fn duration_text(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    for (unit, per) in [
        ("d", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("min", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
    ] {
        if ns % per == 0 {
            return format!("{}{unit}", ns / per);
        }
    }
    format!("{}ms", num(ns as f64 / 1e6, 6))
}

/// A rate per second as a configuration writes it: a whole number of
/// tokens per the shortest unit that gives one (`1/min` for 1/60 per
/// second, `400/h` for `100/15min`), else per second as a decimal.
pub(crate) fn rate_text(per_sec: f64) -> String {
    for (unit, secs) in [("s", 1.0), ("min", 60.0), ("h", 3600.0), ("d", 86_400.0)] {
        let n = per_sec * secs;
        if n >= 1.0 && (n - n.round()).abs() <= 1e-9 * n {
            return format!("{}/{unit}", n.round());
        }
    }
    format!("{}/s", num(per_sec, 9))
}

/// A number for people: at most `decimals` decimals, no trailing zeros.
pub(crate) fn num(x: f64, decimals: usize) -> String {
    let s = format!("{x:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}
