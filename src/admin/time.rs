//! Timestamps as `explain` and `top` read and write them: RFC 3339 in UTC,
//! to the millisecond; and Redis's own clock, which every command reads
//! buckets on.

use fred::interfaces::ClientLike;
use fred::types::{CustomCommand, Value};

use crate::store::StoreError;
use crate::store::redis::reply::map_err;

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `ms` since the epoch as `2026-12-01T04:31:07.123Z`.
pub(super) fn format_time(ms: u64) -> String {
    let secs = (ms / 1000) as i64;
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        s / 3600,
        s % 3600 / 60,
        s % 60,
        ms % 1000
    )
}

/// An RFC 3339 time → ms since the epoch.
pub(super) fn parse_time(t: &str) -> Result<u64, String> {
    const SHAPE: &str = "expected an RFC 3339 time such as 2026-12-01T04:31:00Z";
    let b = t.as_bytes();
    let n = |r: std::ops::Range<usize>| -> Result<i64, String> {
        t.get(r)
            .filter(|s| s.bytes().all(|c| c.is_ascii_digit()))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| SHAPE.to_owned())
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(SHAPE.into());
    }
    if b[13] != b':' || b[16] != b':' {
        return Err(SHAPE.into());
    }
    let (y, mo, d, h, mi, s) = (
        n(0..4)?,
        n(5..7)?,
        n(8..10)?,
        n(11..13)?,
        n(14..16)?,
        n(17..19)?,
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return Err(format!("{SHAPE} (a field is out of range)"));
    }
    let mut i = 19;
    let mut ms = 0;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Err(SHAPE.into());
        }
        let frac = &t[start..i.min(start + 3)];
        ms = frac.parse::<i64>().map_err(|_| SHAPE.to_owned())? * 10_i64.pow(3 - frac.len() as u32);
    }
    let offset_s = match &t[i..] {
        "Z" | "z" => 0,
        o if o.len() == 6 && matches!(&o[..1], "+" | "-") && &o[3..4] == ":" => {
            let sign = if &o[..1] == "-" { -1 } else { 1 };
            let oh: i64 = o[1..3].parse().map_err(|_| SHAPE.to_owned())?;
            let om: i64 = o[4..6].parse().map_err(|_| SHAPE.to_owned())?;
            sign * (oh * 3600 + om * 60)
        }
        _ => return Err(format!("{SHAPE} (with Z or an offset like +01:00)")),
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - offset_s;
    u64::try_from(secs * 1000 + ms).map_err(|_| "a time before 1970".to_owned())
}

/// Redis `TIME` in µs.
pub(super) async fn redis_now_us(pool: &fred::clients::Pool) -> Result<f64, StoreError> {
    let time: Vec<String> = pool
        .custom(
            CustomCommand::new_static("TIME", None, false),
            Vec::<Value>::new(),
        )
        .await
        .map_err(map_err)?;
    match time.as_slice() {
        [s, us] => Ok(s.parse::<f64>().unwrap_or(0.0) * 1e6 + us.parse::<f64>().unwrap_or(0.0)),
        _ => Err(StoreError::Protocol(
            "TIME did not answer two numbers".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        let t = parse_time("2026-12-01T04:31:07.123Z").unwrap();
        assert_eq!(format_time(t), "2026-12-01T04:31:07.123Z");
        assert_eq!(parse_time("1970-01-01T00:00:00Z").unwrap(), 0);
        assert_eq!(
            parse_time("2026-12-01T05:31:07.123+01:00").unwrap(),
            t,
            "an offset is taken off"
        );
        assert_eq!(
            parse_time("2024-02-29T00:00:00Z").unwrap(),
            1_709_164_800_000
        );
        for bad in [
            "yesterday",
            "2026-12-01",
            "2026-13-01T00:00:00Z",
            "2026-12-01T00:00:00",
        ] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
    }
}
