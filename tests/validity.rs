//! One notion of valid state: for each algorithm, the Rust validity rule
//! the admin tools read stored values with (`Admin::inspect`, on
//! `src/algorithm/<alg>.rs`) and the Lua scripts' own (what a check on a
//! real redis-server does with the value) take the same values for states
//! and the same values as absent, edge cases of Lua's `tonumber` included
//! (white space, hexadecimal, `inf`, `1e400`, a far TAT vouched for by its
//! expiry or not).
#![cfg(feature = "redis")]

use crate::support;

use std::time::Duration;

use fleetlimit::admin::Admin;
use support::*;

/// Redis `TIME` in µs.
fn now_us(server: &RedisServer) -> u64 {
    let t = server.cli(&["TIME"]).unwrap();
    let mut it = t.lines().map(|l| l.trim().parse::<u64>().unwrap());
    it.next().unwrap() * 1_000_000 + it.next().unwrap()
}

/// One limit `l` keyed by account on route `/`, closed on a Redis failure
/// (a failed check answers 503: never mistaken for a full bucket).
fn config(server: &RedisServer, prefix: &str, limit: &str) -> fleetlimit::Config {
    let body = format!(
        "[limits.l]\nkey = \"account:x-account\"\n{limit}\n\n[[routes]]\npath = \"/\"\nlimits = [\"l\"]\non_redis_error = \"closed\"\n"
    );
    redis_config(server, prefix, "500ms", &body)
}

/// A case's raw value that stands for the 8-byte double of the number
/// after it (what the scripts write for a token bucket).
const DOUBLE: &str = "double:";

/// A case: the raw value, its expiry (ms; `None`: none), and a note.
type Case = (String, Option<u64>, &'static str);

/// For each case, a caller of its own: the value written, read by
/// `inspect` (the Rust rule), then checked by the layer (the Lua rule): an
/// invalid state is a full bucket to both, a valid one leaves what inspect
/// said, less the request's one unit.
async fn agree(server: &RedisServer, cfg: fleetlimit::Config, capacity: f64, cases: &[Case]) {
    let prefix = cfg.key_prefix().to_owned();
    let admin = Admin::connect(&cfg).await.unwrap();
    let app = ok_app(cfg).await;
    let mut invalid = 0;
    for (i, (raw, px, note)) in cases.iter().enumerate() {
        let caller = format!("c{i}");
        let key = format!("{prefix}:l:{{a:{caller}}}");
        let ms = px.map(|p| p.to_string());
        if let Some(x) = raw.strip_prefix(DOUBLE) {
            // The 8 bytes the scripts write (NUL bytes cannot be a
            // redis-cli argument): packed by Redis's own Lua.
            let pack = "redis.call('SET', KEYS[1], struct.pack('<d', tonumber(ARGV[1]))) \
                if ARGV[2] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end";
            let mut eval = vec!["EVAL", pack, "1", &key, x];
            if let Some(ms) = &ms {
                eval.push(ms);
            }
            server.cli(&eval).unwrap();
        } else {
            let mut set = vec!["SET", &key, raw.as_str()];
            if let Some(ms) = &ms {
                set.extend(["PX", ms]);
            }
            server.cli(&set).unwrap();
        }
        let b = admin.inspect(&caller, Some("l")).await.unwrap().remove(0);
        let res = send(
            &app,
            request("GET", "/", "10.0.0.1:1", &[("x-account", &caller)]),
        )
        .await;
        let status = res.status().as_u16();
        let remaining = header_u64(&res, "x-ratelimit-remaining") as f64;
        let what = format!(
            "case {i} {raw:?} (expiry {px:?}, {note}): inspect says {:?}",
            b.state()
        );
        if b.invalid() {
            invalid += 1;
            assert_eq!(b.remaining(), capacity, "{what}");
            assert_eq!(
                (status, remaining),
                (200, capacity - 1.0),
                "{what}: the script did not take it as absent"
            );
        } else if b.remaining() < 1.0 {
            assert_eq!(status, 429, "{what}: the script took it as absent");
        } else {
            assert_eq!(status, 200, "{what}");
            // Less one unit, in whole units. Room only grows between the
            // two reads (by milliseconds of refill): one more whole unit
            // only if inspect's count was within a hair of it.
            let left = b.remaining() - 1.0;
            let next = remaining == left.floor() + 1.0 && left.fract() > 0.999;
            assert!(
                remaining == left.floor() || next,
                "{what}: the script says {remaining}"
            );
        }
    }
    assert!(
        invalid > 0 && invalid < cases.len(),
        "both kinds among the cases"
    );
}

#[tokio::test]
async fn token_bucket_states_are_told_apart_alike() {
    let server = RedisServer::start();
    let prefix = prefix("validity-tb");
    // 10 tokens at 1/min: a token is 60 s, a full burst 600 s.
    let cfg = config(&server, &prefix, "capacity = 10\nrefill = \"1/min\"");
    let now = now_us(&server);
    // 3.5 tokens spent: 6.5 left, half a token (30 s) from a whole number.
    let tat = now + 210_000_000;
    // 11.5 tokens ahead: past the burst, valid only with an expiry that
    // reaches it (690 s).
    let far = now + 690_000_000;
    let cases: Vec<Case> = vec![
        (tat.to_string(), Some(600_000), "a TAT"),
        (format!(" {tat}"), Some(600_000), "leading space"),
        (format!("{tat}\t\n"), Some(600_000), "trailing space"),
        (format!("0x{tat:x}"), Some(600_000), "hexadecimal"),
        (format!("{tat}.25"), Some(600_000), "a fraction"),
        (format!("{}e3", tat / 1000), Some(600_000), "an exponent"),
        (
            (now - 1_000_000).to_string(),
            Some(600_000),
            "in the past: full",
        ),
        (
            far.to_string(),
            Some(700_000),
            "far, vouched for by its expiry",
        ),
        (far.to_string(), Some(600_000), "far, the expiry too short"),
        (far.to_string(), None, "far, no expiry"),
        ("inf".into(), Some(600_000), "inf"),
        ("-inf".into(), Some(600_000), "-inf"),
        ("nan".into(), Some(600_000), "nan"),
        ("1e400".into(), Some(600_000), "1e400"),
        ("99999999999999999999999".into(), Some(600_000), "10^23"),
        ("x".into(), Some(600_000), "text"),
        ("0x".into(), Some(600_000), "a bare 0x"),
        ("1e".into(), Some(600_000), "a bare exponent"),
        (format!("{tat} {tat}"), Some(600_000), "two numbers"),
        // As the scripts write it now: the 8 bytes of a double.
        (format!("{DOUBLE}{tat}"), Some(600_000), "a TAT, 8 bytes"),
        (
            format!("{DOUBLE}{tat}.25"),
            Some(600_000),
            "a fraction, 8 bytes",
        ),
        (
            format!("{DOUBLE}{}", now - 1_000_000),
            Some(600_000),
            "in the past, 8 bytes: full",
        ),
        (
            format!("{DOUBLE}{far}"),
            Some(700_000),
            "far, vouched for, 8 bytes",
        ),
        (format!("{DOUBLE}{far}"), None, "far, no expiry, 8 bytes"),
        (format!("{DOUBLE}inf"), Some(600_000), "inf, 8 bytes"),
        (format!("{DOUBLE}-inf"), Some(600_000), "-inf, 8 bytes"),
        (format!("{DOUBLE}nan"), Some(600_000), "nan, 8 bytes"),
        (
            "12345678".into(),
            Some(600_000),
            "8 bytes of text: a double long past, full",
        ),
    ];
    agree(&server, cfg, 10.0, &cases).await;
    server.kill();
}

#[tokio::test]
async fn fixed_window_counts_are_told_apart_alike() {
    let server = RedisServer::start();
    let prefix = prefix("validity-fw");
    let cfg = config(
        &server,
        &prefix,
        "algorithm = \"fixed-window\"\nlimit = 10\nwindow = \"1h\"",
    );
    let hour = Some(600_000);
    let cases: Vec<Case> = vec![
        ("3".into(), hour, "a count"),
        ("0".into(), hour, "zero"),
        ("3".into(), None, "no expiry: older code, repaired"),
        ("3".into(), Some(7_200_000), "an expiry past the window"),
        ("999999999999999".into(), hour, "15 digits, above the limit"),
        ("9999999999999999".into(), hour, "16 digits"),
        ("03".into(), hour, "a leading zero"),
        ("3.0".into(), hour, "a fraction"),
        ("-1".into(), hour, "negative"),
        ("1e1".into(), hour, "an exponent"),
        (" 3".into(), hour, "leading space"),
        ("inf".into(), hour, "inf"),
        ("1e400".into(), hour, "1e400"),
        ("99999999999999999999999".into(), hour, "10^23"),
    ];
    agree(&server, cfg, 10.0, &cases).await;
    server.kill();
}

#[tokio::test]
async fn sliding_window_states_are_told_apart_alike() {
    let server = RedisServer::start();
    let prefix = prefix("validity-sw");
    let window_ms = 3_600_000;
    let cfg = config(
        &server,
        &prefix,
        "algorithm = \"sliding-window\"\nlimit = 10\nwindow = \"1h\"",
    );
    // Far from the window's end, so every case is read in the window it
    // was written for.
    let mut now_ms = now_us(&server) / 1000;
    let left = window_ms - now_ms % window_ms;
    if left < 60_000 {
        tokio::time::sleep(Duration::from_millis(left + 100)).await;
        now_ms = now_us(&server) / 1000;
    }
    let idx = now_ms / window_ms;
    let px = Some(2 * window_ms);
    let cases: Vec<Case> = vec![
        (format!("{idx} 3 0"), px, "this window"),
        (format!("{idx} 3.5 1"), px, "fractional counts"),
        (format!("{} 4 0", idx - 1), px, "the previous window"),
        (
            format!("{} 9 9", idx - 5),
            px,
            "an old window: weighs nothing",
        ),
        (format!("{idx} 0x3 0"), px, "a hexadecimal count"),
        (format!("{idx}.0 3 0"), px, "an index written with .0"),
        (format!("{} 3 0", idx + 1), px, "a future window"),
        (format!("{idx} 3"), px, "two numbers"),
        (format!("{idx}  3 0"), px, "two spaces"),
        (format!("{idx} 3 -1"), px, "a negative count"),
        (format!("{idx} inf 0"), px, "inf"),
        (format!("{idx} 1e400 0"), px, "1e400"),
        (format!("{idx}.5 3 0"), px, "a fractional index"),
        (
            format!("{idx} 3 9007199254740994"),
            px,
            "a count above 2^53",
        ),
    ];
    agree(&server, cfg, 10.0, &cases).await;
    server.kill();
}

/// Concurrency keeps a sorted set: slots past their deadline or further
/// ahead than `max_hold` are not counted by either; a string is not a set
/// of slots.
#[tokio::test]
async fn concurrency_slots_are_counted_alike() {
    let server = RedisServer::start();
    let prefix = prefix("validity-c");
    let cfg = config(
        &server,
        &prefix,
        "algorithm = \"concurrency\"\nmax_in_flight = 5\nmax_hold = \"1min\"",
    );
    let admin = Admin::connect(&cfg).await.unwrap();
    let app = ok_app(cfg).await;
    let now = now_us(&server);
    let soon = (now + 30_000_000).to_string();
    let far = (now + 120_000_000).to_string();
    let past = (now - 1_000_000).to_string();
    let cases: [(&str, Vec<&str>, f64); 4] = [
        ("two live", vec![&soon, &soon], 3.0),
        ("one live, one past its deadline", vec![&soon, &past], 4.0),
        ("one live, one beyond max_hold", vec![&soon, &far], 4.0),
        ("none live", vec![&past], 5.0),
    ];
    for (i, (what, scores, free)) in cases.iter().enumerate() {
        let caller = format!("c{i}");
        let key = format!("{prefix}:l:{{a:{caller}}}");
        for (j, s) in scores.iter().enumerate() {
            server
                .cli(&["ZADD", &key, s, &format!("slot-{j}")])
                .unwrap();
        }
        server.cli(&["PEXPIRE", &key, "60000"]).unwrap();
        let b = admin.inspect(&caller, Some("l")).await.unwrap().remove(0);
        assert_eq!(b.remaining(), *free, "{what}: {}", b.state());
        let res = send(
            &app,
            request("GET", "/", "10.0.0.1:1", &[("x-account", &caller)]),
        )
        .await;
        assert_eq!(res.status(), 200, "{what}");
        assert_eq!(
            header_u64(&res, "x-ratelimit-remaining") as f64,
            free - 1.0,
            "{what}"
        );
    }
    // A string where the set belongs: not fleetlimit's, to both.
    let key = format!("{prefix}:l:{{a:str}}");
    server.cli(&["SET", &key, "3", "PX", "60000"]).unwrap();
    let b = admin.inspect("str", Some("l")).await.unwrap().remove(0);
    assert!(b.invalid(), "{}", b.state());
    let res = send(
        &app,
        request("GET", "/", "10.0.0.1:1", &[("x-account", "str")]),
    )
    .await;
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 4);
    server.kill();
}
