//! How the scripts' replies and fred's errors read to the layer: a call's
//! [`Answer`], Redis's clock taken off it, the outcome decoded, and the
//! error kinds mapped to [`StoreError`].

use std::sync::Arc;

use fred::error::{Error as FredError, ErrorKind};
use fred::types::Value;
use tokio::time::Instant;

use super::clock::RedisClock;
use crate::algorithm::{LeanArgs, LimitState};
use crate::answer::decimal;
use crate::store::{Bucket, Check, Outcome, StoreError};

/// A script call's answer: fred's reply, when the call was sent, and the
/// clock of the node that ran it.
pub(crate) struct Answer {
    pub(crate) reply: Result<Value, StoreError>,
    pub(crate) sent: Instant,
    pub(crate) clock: Arc<RedisClock>,
    /// The redirection it met and followed (`MOVED` or `ASK`), if any.
    pub(crate) redirected: Option<&'static str>,
}

impl Answer {
    /// The reply's answers, Redis's clock taken off and learnt ([`timed`]).
    pub(crate) fn items(self) -> Result<Vec<Value>, StoreError> {
        timed(self.reply?, self.sent, &self.clock).map(|(items, _)| items)
    }
}

/// A check's answer decoded as [`decode`] does, with, per bucket, the end
/// on Redis's clock (µs) of the window it charged: what it charged is
/// given back only until then (`None`: no window, or not charged).
pub(super) fn decode_charged(
    answer: Answer,
    check: &Check,
    lean: Option<LeanArgs>,
) -> Result<(Outcome, WindowEnds), StoreError> {
    if lean.is_some() {
        return decode(answer, check, lean).map(|o| (o, WindowEnds::new()));
    }
    let (items, now) = timed(answer.reply?, answer.sent, &answer.clock)?;
    // A time no Redis gives (see clock.rs) bounds the give-back at the
    // epoch's first windows, long past: it changes nothing, and what was
    // charged stays charged (an over-count, the safe side).
    let now = if (1..1_i64 << 53).contains(&now) {
        now
    } else {
        0
    };
    let x = numbers(&items, &check.buckets)?;
    let o = outcome(&x, &check.buckets, check.cost);
    let mut at = 1;
    let mut ends = WindowEnds::new();
    for (b, s) in check.buckets.iter().zip(&o.limits) {
        let n = b.rule.reply_len();
        let charged = o.allowed && s.enough;
        ends.push(
            charged
                .then(|| b.rule.window_end(now, &x[at..at + n]))
                .flatten(),
        );
        at += n;
    }
    Ok((o, ends))
}

/// Per bucket of a check, the end of the window it charged (see
/// [`decode_charged`]); empty when none is a window.
pub(crate) type WindowEnds = smallvec::SmallVec<[Option<i64>; 1]>;

/// The earliest end among `ends` of the buckets `of`: a give-back to them
/// runs until then.
pub(crate) fn earliest(ends: &[Option<i64>], of: &[usize]) -> Option<i64> {
    of.iter()
        .filter_map(|&i| ends.get(i).copied().flatten())
        .min()
}

/// A check's answer, decoded: the lean script's (`lean`) or the general
/// script's.
pub(super) fn decode(
    answer: Answer,
    check: &Check,
    lean: Option<LeanArgs>,
) -> Result<Outcome, StoreError> {
    let items = answer.items()?;
    let Some(lean) = lean else {
        return parse(items, &check.buckets, check.cost);
    };
    match <[Value; 1]>::try_from(items) {
        Ok([reply]) => {
            let b = &check.buckets[0];
            lean.parse(&reply, b.rule.capacity(), b.shadow)
        }
        Err(other) => Err(StoreError::Protocol(format!(
            "lean script: unexpected {other:?}"
        ))),
    }
}

pub(super) fn is_noscript(e: &FredError) -> bool {
    e.details().starts_with("NOSCRIPT")
}

/// How a fred error looks to the layer.
pub(crate) fn map_err(e: FredError) -> StoreError {
    match e.kind() {
        ErrorKind::Timeout => StoreError::Timeout,
        ErrorKind::IO | ErrorKind::Canceled | ErrorKind::Backpressure | ErrorKind::Routing => {
            StoreError::Unavailable(e.to_string())
        }
        ErrorKind::Protocol | ErrorKind::Parse => StoreError::Protocol(e.to_string()),
        // Raised by a command inside a script (Redis names the script's
        // line): one check's data or numbers, unless its code says Redis
        // is not serving (OOM, READONLY, ...).
        _ if e.details().contains("@user_script") => match command_error(e.details()) {
            StoreError::Script(_) => StoreError::Script(e.to_string()),
            _ => StoreError::Redis(e.to_string()),
        },
        _ => StoreError::Redis(e.to_string()),
    }
}

/// A command error met inside a script. `ERR` and `WRONGTYPE` (a value or
/// type Redis refuses) and Lua's own errors (no upper-case code) concern the
/// check; any other code (`OOM`, `READONLY`, `NOPERM`...) concerns Redis.
pub(crate) fn command_error(text: &str) -> StoreError {
    let code = text.split_whitespace().next().unwrap_or("");
    if code == "ERR" || code == "WRONGTYPE" || code.bytes().any(|b| !b.is_ascii_uppercase()) {
        StoreError::Script(text.to_owned())
    } else {
        StoreError::Redis(text.to_owned())
    }
}

/// The "not after" argument of a call whose caller stops waiting at
/// `give_up`: Redis's time no later than that moment (nor than `until`, a
/// give-back's windows' end), or "" (no bound) while Redis's clock is not
/// known.
pub(crate) fn not_after(clock: &RedisClock, give_up: Instant, until: Option<i64>) -> Value {
    match (clock.not_after(give_up), until) {
        (Some(us), Some(end)) => Value::Integer(us.min(end)),
        (Some(us), None) | (None, Some(us)) => Value::Integer(us),
        (None, None) => Value::from_static_str(""),
    }
}

/// The "not after" argument of a call whose caller stops waiting at
/// `give_up` ([`not_after`]): text, or when `packed` (the one-check
/// script's) the first of its three doubles (+inf: no bound), the rest of
/// `current` ([`LeanArgs::packed`]) kept.
pub(crate) fn bound(
    packed: bool,
    current: &Value,
    clock: &RedisClock,
    give_up: Instant,
    until: Option<i64>,
) -> Value {
    let text = not_after(clock, give_up, until);
    if !packed {
        return text;
    }
    let mut bytes = [0u8; 24];
    if let Some(b) = current.as_bytes().filter(|b| b.len() == 24) {
        bytes.copy_from_slice(b);
    }
    let us = text.as_i64().map_or(f64::INFINITY, |us| us as f64);
    bytes[..8].copy_from_slice(&us.to_le_bytes());
    Value::Bytes(bytes::Bytes::copy_from_slice(&bytes))
}

/// A script's reply without its last item, Redis's clock when it ran
/// (learnt by `clock`, for a call handed at `sent`, and answered beside
/// the items); `Late` when the script ran after its bound and changed
/// nothing.
pub(crate) fn timed(
    reply: Value,
    sent: Instant,
    clock: &RedisClock,
) -> Result<(Vec<Value>, i64), StoreError> {
    let bad = |why: String| StoreError::Protocol(format!("script: {why}"));
    let Value::Array(mut items) = reply else {
        return Err(bad(format!("not an array: {reply:?}")));
    };
    let now = match items.pop() {
        // A time no Redis gives teaches the clock nothing (see clock.rs);
        // the answer stands.
        Some(Value::Integer(now)) => {
            clock.observe(sent, now);
            now
        }
        other => return Err(bad(format!("no clock after the answers: {other:?}"))),
    };
    if let [Value::String(late)] = items.as_slice() {
        if &**late == "LATE" {
            return Err(StoreError::Late);
        }
    }
    Ok((items, now))
}

/// The decision script's reply: the verdict, then each limit's numbers
/// (integers, or text for a fraction), which its algorithm decodes
/// ([`Rule::script_answer`](crate::algorithm::Rule::script_answer)).
pub(super) fn parse(
    items: Vec<Value>,
    buckets: &[Bucket],
    cost: f64,
) -> Result<Outcome, StoreError> {
    Ok(outcome(&numbers(&items, buckets)?, buckets, cost))
}

/// The decision script's reply as numbers, checked against the buckets.
fn numbers(items: &[Value], buckets: &[Bucket]) -> Result<Vec<f64>, StoreError> {
    let bad = |why: &str| StoreError::Protocol(format!("decision script: {why}"));
    let len: usize = buckets.iter().map(|b| b.rule.reply_len()).sum();
    if items.len() != 1 + len {
        return Err(bad("wrong length"));
    }
    let num = |v: &Value| -> Result<f64, StoreError> {
        match v {
            Value::Integer(x) => Ok(*x as f64),
            _ => v
                .as_str()
                .and_then(|s| s.parse::<f64>().ok())
                .ok_or_else(|| bad("not a number")),
        }
    };
    items.iter().map(num).collect()
}

/// The verdict and each limit's state, from [`numbers`].
fn outcome(x: &[f64], buckets: &[Bucket], cost: f64) -> Outcome {
    let allowed = x[0] == 1.0;
    let mut at = 1;
    let limits = buckets
        .iter()
        .map(|b| {
            let n = b.rule.reply_len();
            let state = b.rule.script_answer(cost, &x[at..at + n]);
            at += n;
            LimitState {
                // Within the slack, a bucket may pass its capacity by a hair.
                remaining: state.remaining.min(b.rule.capacity()),
                ..state
            }
        })
        .collect();
    Outcome { allowed, limits }
}

/// The lean script's arguments and answers as fred values; the arithmetic
/// is the token bucket's (`algorithm/token_bucket.rs`).
impl LeanArgs {
    /// The check's two arguments. Rust prints the shortest text that reads
    /// back as the same `f64`, so Lua's `tonumber` sees exactly these values.
    pub(crate) fn values(&self) -> (Value, Value) {
        let (inc, limit) = self.args();
        (Value::from(lua_number(inc)), Value::from(lua_number(limit)))
    }

    /// The one-check script's argument: three little-endian doubles, the
    /// call's bound (+inf until it is sent: `script::bound` sets it), the
    /// charge and the burst as [`values`](Self::values) writes them. Bytes,
    /// not text: Redis's Lua reads a text number with C's `strtod`, which
    /// cost it more than the rest of a one-check decision's arithmetic.
    pub(crate) fn packed(&self) -> Value {
        let (inc, limit) = self.args();
        let mut b = [0u8; 24];
        b[..8].copy_from_slice(&f64::INFINITY.to_le_bytes());
        b[8..16].copy_from_slice(&inc.to_le_bytes());
        b[16..].copy_from_slice(&limit.to_le_bytes());
        Value::Bytes(bytes::Bytes::copy_from_slice(&b))
    }

    /// The script's answer for this check: 4 × (TAT − now) in µs after the
    /// charge when admitted, −1 − 4 × (TAT − now) when refused, or the error
    /// text of the command that failed at this check.
    pub(crate) fn parse(
        &self,
        reply: &Value,
        capacity: f64,
        shadow: bool,
    ) -> Result<Outcome, StoreError> {
        let x = match reply {
            Value::Integer(x) => *x,
            // The script stopped at this check: a command failed.
            Value::String(text) => return Err(command_error(text)),
            Value::Bytes(text) => return Err(command_error(&String::from_utf8_lossy(text))),
            _ => {
                return Err(StoreError::Protocol(format!(
                    "lean script: unexpected {reply:?}"
                )));
            }
        };
        let state = self.answer(x);
        let state = LimitState { capacity, ..state };
        Ok(Outcome {
            // A shadow limit never refuses; it was charged only if it had room.
            allowed: state.enough || shadow,
            limits: vec![state],
        })
    }
}

/// `x` as `f64`'s `Display` writes it, by way of the integer printer when
/// `x` is a whole number of quarters of modest size (the common case: µs
/// of a rate in whole requests per second or minute, and the lean script's
/// half-µs slack): a tenth of the cost of the shortest-float search, with
/// the same text (below 2^40 a double's spacing is finer than 0.05, so no
/// shorter text reads back as the same value).
pub(crate) fn lua_number(x: f64) -> String {
    const PLAIN: f64 = 1_099_511_627_776.0; // 2^40
    let a = x.abs();
    let quarters = a * 4.0;
    if a < PLAIN && quarters.fract() == 0.0 && !(x == 0.0 && x.is_sign_negative()) {
        let whole = a.trunc() as u64;
        let tail = match quarters as u64 % 4 {
            0 => "",
            1 => ".25",
            2 => ".5",
            _ => ".75",
        };
        // By hand: `format!` costs as much as the float search it avoids.
        let mut buf = [0u8; 20];
        let digits = decimal(whole, &mut buf);
        let mut s = String::with_capacity(1 + digits.len() + tail.len());
        if x < 0.0 {
            s.push('-');
        }
        s.push_str(digits);
        s.push_str(tail);
        s
    } else {
        x.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lua_numbers_are_written_as_display_writes_them() {
        for x in [
            0.0,
            -0.0,
            1.0,
            -1.0,
            60_000.0,
            1.5,
            -2.25,
            1e15,
            9_007_199_254_740_991.0,
            9_007_199_254_740_992.0,
            1e300,
            0.1,
            f64::MIN_POSITIVE,
        ] {
            assert_eq!(lua_number(x), x.to_string(), "{x:?}");
        }
    }
    use crate::algorithm::Rule;
    use std::time::Duration;

    #[test]
    fn parses_integer_replies() {
        let bucket = |rule| Bucket {
            key: "k".into(),
            rule,
            shadow: false,
        };
        let buckets = [
            // 5 tokens at 10/s: refused at TAT − now = 460 ms (0.4 token).
            bucket(Rule::TokenBucket {
                capacity: 5.0,
                refill_per_sec: 10.0,
            }),
            // 3 counted of 3, 40 s left.
            bucket(Rule::FixedWindow {
                limit: 3.0,
                window: Duration::from_secs(60),
            }),
            // 2.5 s into a 10 s window: 10 in the previous one weigh 7.5.
            bucket(Rule::SlidingWindow {
                limit: 10.0,
                window: Duration::from_secs(10),
            }),
            // 2 of 2 slots, the oldest held 4 s of 30.
            bucket(Rule::Concurrency {
                max_in_flight: 2.0,
                max_hold: Duration::from_secs(30),
            }),
        ];
        let reply: Vec<Value> = vec![
            0.into(),
            (-1 - 4 * 460_000).into(),
            (-1 - 3).into(),
            40_000.into(),
            2_500.into(),
            "0".into(),
            10.into(),
            (-1 - 2).into(),
            29_000_000.into(),
            26_000_000.into(),
        ];
        let o = parse(reply.clone(), &buckets, 1.0).unwrap();
        assert!(!o.allowed);
        let [t, f, s, c] = o.limits[..] else {
            panic!("{o:?}")
        };
        assert!(!t.enough && (t.remaining - 0.4).abs() < 1e-9);
        assert!((t.wait - 0.06).abs() < 1e-9 && (t.reset - 0.46).abs() < 1e-9);
        assert!(!f.enough);
        assert_eq!((f.remaining, f.wait, f.reset), (0.0, 40.0, 40.0));
        assert!(s.enough && (s.remaining - 2.5).abs() < 1e-9);
        assert_eq!((s.wait, s.reset), (0.0, 7.5));
        assert!(!c.enough);
        assert_eq!((c.remaining, c.wait, c.reset), (0.0, 4.0, 29.0));
        assert!(parse(vec![1.into()], &buckets, 1.0).is_err());
        assert!(parse(Vec::new(), &buckets, 1.0).is_err());
    }

    #[tokio::test]
    async fn a_charge_answers_the_end_of_each_window_it_went_into() {
        let bucket = |rule| Bucket {
            key: "k".into(),
            rule,
            shadow: false,
        };
        let w = Duration::from_secs(3);
        let check = Check {
            cost: 1.0,
            buckets: vec![
                bucket(Rule::FixedWindow {
                    limit: 5.0,
                    window: w,
                }),
                bucket(Rule::SlidingWindow {
                    limit: 5.0,
                    window: w,
                }),
                bucket(Rule::TokenBucket {
                    capacity: 5.0,
                    refill_per_sec: 1.0,
                }),
            ],
            slot: None,
        };
        let answer = |items: Vec<Value>| Answer {
            reply: Ok(Value::Array(items)),
            sent: Instant::now(),
            clock: Arc::new(RedisClock::new()),
            redirected: None,
        };
        // At 7.5004 s: the fixed window has 250 ms left; the sliding one is
        // 1,500 ms into [6 s, 9 s); the token bucket has no window.
        let now = 7_500_400_i64;
        let charged_items: Vec<Value> = vec![
            1.into(),
            1.into(),
            250.into(),
            1500.into(),
            1.into(),
            0.into(),
            0.into(),
            now.into(),
        ];
        let (o, ends) = decode_charged(answer(charged_items.clone()), &check, None).unwrap();
        assert!(o.allowed);
        assert_eq!(ends.as_slice(), [Some(7_750_399), Some(8_999_999), None]);
        assert_eq!(earliest(&ends, &[0, 1, 2]), Some(7_750_399));
        assert_eq!(earliest(&ends, &[1, 2]), Some(8_999_999));
        assert_eq!(earliest(&ends, &[2]), None);
        // Refused: nothing was charged, so nothing is given back anywhere.
        let mut refused = charged_items.clone();
        refused[0] = 0.into();
        refused[1] = (-2).into();
        let (_, ends) = decode_charged(answer(refused), &check, None).unwrap();
        assert_eq!(ends.as_slice(), [None, None, None]);
        // A clock no Redis reads: bounds long past, so nothing is given back.
        let mut garbage = charged_items.clone();
        *garbage.last_mut().unwrap() = (-3).into();
        let (_, ends) = decode_charged(answer(garbage), &check, None).unwrap();
        assert_eq!(ends.as_slice(), [Some(249_999), Some(1_499_999), None]);
    }

    #[tokio::test]
    async fn a_packed_bound_is_the_first_double_and_keeps_the_check_s_numbers() {
        let args = LeanArgs::new(5.0, 10.0, 1.0);
        let packed = args.packed();
        let doubles = |v: &Value| -> Vec<f64> {
            let b = v.as_bytes().unwrap();
            assert_eq!(b.len(), 24);
            b.chunks(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        // Unsent: no bound yet; the charge and the burst with its slack.
        assert_eq!(doubles(&packed), [f64::INFINITY, 100_000.0, 500_000.5]);
        let clock = RedisClock::new();
        let give_up = Instant::now();
        // Redis's clock not known yet: no bound, the numbers kept.
        let unknown = bound(true, &packed, &clock, give_up, None);
        assert_eq!(doubles(&unknown), [f64::INFINITY, 100_000.0, 500_000.5]);
        // Known: the bound is the text form's number, as a double.
        let now = 1_800_000_000_000_000_i64;
        assert!(clock.observe(Instant::now(), now));
        let text = bound(false, &packed, &clock, give_up, Some(now + 5));
        let us = text.as_i64().unwrap();
        let sent = bound(true, &packed, &clock, give_up, Some(now + 5));
        assert_eq!(doubles(&sent), [us as f64, 100_000.0, 500_000.5]);
    }

    #[tokio::test]
    async fn replies_carry_redis_clock_and_late_changes_nothing() {
        let clock = RedisClock::new();
        let now = 1_800_000_000_000_000_i64;
        let sent = Instant::now();
        // Answers, then the clock: the clock is learnt and taken off.
        let items = timed(Value::Array(vec![5.into(), now.into()]), sent, &clock).unwrap();
        assert_eq!(items, (vec![Value::Integer(5)], now));
        assert!(clock.not_after(Instant::now()).is_some());
        // Run after its bound.
        let late = Value::Array(vec!["LATE".into(), (now + 10).into()]);
        assert_eq!(timed(late, sent, &clock), Err(StoreError::Late));
        // No clock, or not an array: an answer no script gives.
        for bad in [
            Value::Null,
            Value::Array(vec![]),
            Value::Array(vec![5.into(), "x".into()]),
        ] {
            assert!(
                matches!(timed(bad, sent, &clock), Err(StoreError::Protocol(_))),
                "protocol error"
            );
        }
        // A clock no Redis reads: the answer stands, the clock learns nothing.
        let before = clock.not_after(sent);
        let items = timed(Value::Array(vec![7.into(), (-3).into()]), sent, &clock).unwrap();
        assert_eq!(items, (vec![Value::Integer(7)], -3));
        assert_eq!(clock.not_after(sent), before);
    }

    #[test]
    fn lean_answers_decode_to_the_limit_state() {
        // 5 tokens at 10/s: 100 ms per token, a burst spans 500 ms.
        let rule = Rule::TokenBucket {
            capacity: 5.0,
            refill_per_sec: 10.0,
        };
        let args = rule.lean_args(1.0).unwrap();
        let (inc, burst) = args.values();
        assert_eq!(
            (inc.as_str().unwrap(), burst.as_str().unwrap()),
            ("100000".into(), "500000.5".into())
        );
        // Admitted, TAT 300 ms ahead after the charge: 2 tokens left.
        let o = args
            .parse(&Value::Integer(4 * 300_000), 5.0, false)
            .unwrap();
        assert!(o.allowed && o.limits[0].enough);
        assert_eq!(o.limits[0].remaining, 2.0);
        assert_eq!(o.limits[0].reset, 0.3);
        assert_eq!(o.limits[0].wait, 0.0);
        // Refused, TAT 450 ms ahead: half a token left, the next one in 50 ms.
        let o = args
            .parse(&Value::Integer(-1 - 4 * 450_000), 5.0, false)
            .unwrap();
        assert!(!o.allowed && !o.limits[0].enough);
        assert!((o.limits[0].remaining - 0.5).abs() < 1e-9);
        assert!((o.limits[0].wait - 0.05).abs() < 1e-9);
        assert_eq!(o.limits[0].reset, 0.45);
        // A shadow limit is reported as refused but lets the request through.
        let o = args.parse(&Value::Integer(-1), 5.0, true).unwrap();
        assert!(o.allowed && !o.limits[0].enough);
        assert!(args.parse(&Value::from("1 2 3 4"), 5.0, false).is_err());
        assert!(
            Rule::FixedWindow {
                limit: 1.0,
                window: Duration::from_secs(1)
            }
            .lean_args(1.0)
            .is_none()
        );
    }

    #[test]
    fn noscript_and_error_kinds_map() {
        let e = FredError::new(
            ErrorKind::Unknown,
            "NOSCRIPT No matching script. Please use EVAL.",
        );
        assert!(is_noscript(&e));
        assert_eq!(
            map_err(FredError::new(ErrorKind::Timeout, "t")),
            StoreError::Timeout
        );
        assert!(matches!(
            map_err(FredError::new(ErrorKind::IO, "refused")),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(map_err(e), StoreError::Redis(_)));
    }

    #[test]
    fn script_errors_on_data_are_not_availability_errors() {
        // Raised out of a script (Redis 7's wording): the check's data.
        let wrongtype = FredError::new(
            ErrorKind::InvalidArgument,
            "WRONGTYPE Operation against a key holding the wrong kind of value \
             script: 3f2a, on @user_script:31.",
        );
        let e = map_err(wrongtype);
        assert!(matches!(e, StoreError::Script(_)), "{e:?}");
        assert!(!e.is_availability());
        let range = FredError::new(
            ErrorKind::Unknown,
            "ERR value is not an integer or out of range script: 3f2a, on @user_script:47.",
        );
        assert!(matches!(map_err(range), StoreError::Script(_)));
        // Redis not serving, even from inside a script.
        for text in [
            "OOM command not allowed when used memory > 'maxmemory'. script: 3f2a, on @user_script:44.",
            "READONLY You can't write against a read only replica. script: 3f2a, on @user_script:44.",
        ] {
            let e = map_err(FredError::new(ErrorKind::Unknown, text));
            assert!(matches!(e, StoreError::Redis(_)), "{e:?}");
            assert!(e.is_availability());
        }
        // Not from a script: as before.
        let e = map_err(FredError::new(
            ErrorKind::Unknown,
            "ERR unknown command 'EVALSHA'",
        ));
        assert!(matches!(e, StoreError::Redis(_)));
        // The lean script's per-check error texts (caught inside the script).
        assert!(matches!(
            command_error("user_script:30: attempt to compare nil with number"),
            StoreError::Script(_)
        ));
        assert!(matches!(
            command_error("WRONGTYPE Operation against a key holding the wrong kind of value"),
            StoreError::Script(_)
        ));
        assert!(matches!(
            command_error("OOM command not allowed when used memory > 'maxmemory'."),
            StoreError::Redis(_)
        ));
        let args = Rule::TokenBucket {
            capacity: 5.0,
            refill_per_sec: 10.0,
        }
        .lean_args(1.0)
        .unwrap();
        assert!(matches!(
            args.parse(
                &Value::from("ERR value is not an integer or out of range"),
                5.0,
                false
            ),
            Err(StoreError::Script(_))
        ));
        assert!(matches!(
            args.parse(&Value::Null, 5.0, false),
            Err(StoreError::Protocol(_))
        ));
    }
}
