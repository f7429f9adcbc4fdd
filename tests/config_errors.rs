//! A bad configuration fails at start-up with what and where:
//! `file:line:column: message`.
// Its fixture has a `[redis]` section: a configuration error without the
// `redis` feature (checked in tests/memory_only.rs instead).
#![cfg(feature = "redis")]

use std::path::PathBuf;

use fleetlimit::Config;

const GOOD: &str = r#"[redis]
url = "redis://127.0.0.1:6379"

[limits.per-key]
key = "header:x-api-key"
capacity = 5
refill = "1/s"

[[routes]]
path = "/"
limits = ["per-key"]
on_redis_error = "open"
"#;

fn file_with(name: &str, contents: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fleetlimit-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

/// Loads `GOOD` with one substitution; returns the error's text.
fn error_for(name: &str, from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "{from}");
    let path = file_with(name, &GOOD.replace(from, to));
    let err = Config::from_toml_file(&path).unwrap_err();
    assert_eq!(err.file(), Some(path.as_path()));
    err.to_string().replace(&path.display().to_string(), name)
}

#[test]
fn the_good_file_loads() {
    let cfg = Config::from_toml_file(file_with("good.toml", GOOD)).unwrap();
    assert_eq!(cfg.redis_url(), Some("redis://127.0.0.1:6379"));
    assert_eq!(cfg.deadline(), std::time::Duration::from_millis(5));
}

#[test]
fn unknown_field() {
    let e = error_for("unknown-field.toml", "capacity = 5", "capacty = 5");
    assert!(
        e.starts_with("unknown-field.toml:6:1: unknown field `capacty`, expected one of"),
        "{e}"
    );
}

#[test]
fn unknown_top_level_section() {
    let e = error_for("unknown-section.toml", "[redis]", "[rediss]");
    assert!(e.starts_with("unknown-section.toml:1:"), "{e}");
    assert!(e.contains("unknown field `rediss`"), "{e}");
}

#[test]
fn unknown_limit_name() {
    let e = error_for(
        "unknown-limit.toml",
        "limits = [\"per-key\"]",
        "limits = [\"per-kee\"]",
    );
    assert_eq!(
        e,
        "unknown-limit.toml:11:11: unknown limit \"per-kee\" (defined: per-key)"
    );
}

#[test]
fn rate_with_an_unknown_unit() {
    let e = error_for("fortnight.toml", "\"1/s\"", "\"10/fortnight\"");
    assert!(
        e.starts_with(
            "fortnight.toml:7:10: invalid rate \"10/fortnight\": unknown time unit \"fortnight\""
        ),
        "{e}"
    );
}

#[test]
fn zero_capacity() {
    let e = error_for("zero.toml", "capacity = 5", "capacity = 0");
    assert_eq!(
        e,
        "zero.toml:6:12: limit \"per-key\": capacity must be at least 1"
    );
}

#[test]
fn bad_custom_key_names_are_located() {
    for (file, key, name) in [
        ("custom-empty.toml", "custom:", ""),
        ("custom-space.toml", "custom:a b", "a b"),
        ("custom-slash.toml", "custom:tenant/id", "tenant/id"),
        ("custom-colon.toml", "custom:a:b", "a:b"),
    ] {
        let e = error_for(file, "\"header:x-api-key\"", &format!("{key:?}"));
        assert!(
            e.starts_with(&format!(
                "{file}:5:7: custom key name {name:?} must be 1 to 64 characters of letters, \
                 digits, '-', '_' or '.' (in key {key:?})"
            )),
            "{e}"
        );
    }
    // A good one loads (the extractor is the layer builder's business).
    let path = file_with(
        "custom-good.toml",
        &GOOD.replace("header:x-api-key", "custom:tenant.v2"),
    );
    let cfg = Config::from_toml_file(path).unwrap();
    assert!(
        cfg.describe().contains("key custom:tenant.v2"),
        "{}",
        cfg.describe()
    );
}

#[test]
fn other_mistakes_are_located_too() {
    let e = error_for("policy.toml", "\"open\"", "\"ajar\"");
    assert!(
        e.starts_with("policy.toml:12:18: unknown variant `ajar`"),
        "{e}"
    );
    let e = error_for("key.toml", "\"header:x-api-key\"", "\"cookie:sid\"");
    assert!(
        e.starts_with("key.toml:5:7: unknown key source \"cookie:sid\""),
        "{e}"
    );
    let e = error_for("cost.toml", "on_redis_error = \"open\"", "cost = 6");
    assert!(
        e.starts_with("cost.toml:12:8: cost 6 is more than limit \"per-key\" can ever hold"),
        "{e}"
    );
    let e = error_for(
        "deadline.toml",
        "url = \"redis://127.0.0.1:6379\"",
        "deadline = \"5 parsecs\"",
    );
    assert!(e.starts_with("deadline.toml:2:12: invalid duration"), "{e}");
    let e = error_for("syntax.toml", "capacity = 5", "capacity = ");
    assert!(e.starts_with("syntax.toml:6:"), "{e}");
}

#[test]
fn a_missing_file_names_the_file() {
    let err = Config::from_toml_file("/nonexistent/fleetlimit.toml").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("/nonexistent/fleetlimit.toml: cannot read the configuration"),
        "{err}"
    );
}

/// Loads `GOOD` with its limit's numbers replaced by `numbers` (lines 6–7)
/// and `extra` appended; returns the error's text.
fn numbers_error(name: &str, numbers: &str, extra: &str) -> String {
    let mut toml = GOOD.replace("capacity = 5\nrefill = \"1/s\"", numbers);
    toml.push_str(extra);
    let path = file_with(name, &toml);
    let err = Config::from_toml_file(&path).unwrap_err();
    err.to_string().replace(&path.display().to_string(), name)
}

// The bounds both stores carry exactly (docs/configuration.md, "Bounds").

#[test]
fn a_refill_too_slow_to_represent_is_rejected_where_it_is_written() {
    // 1e-300 tokens a day: a token's period overflows to infinity, and every
    // Redis check failed with "PXAT inf".
    let e = error_for("slow.toml", "\"1/s\"", "\"1e-300/d\"");
    assert!(
        e.starts_with("slow.toml:7:10: limit \"per-key\": capacity ÷ refill (the time an empty bucket takes to fill) is 5.00e300 days; at most 315360000 s (3650 days, 10 years)"),
        "{e}"
    );
}

#[test]
fn a_refill_faster_than_the_clock_is_rejected() {
    // 1e308 per ms is infinitely many per second: the limit became unlimited.
    let e = error_for("fast.toml", "\"1/s\"", "\"1e308/ms\"");
    assert!(
        e.starts_with("fast.toml:7:10: limit \"per-key\": refill is inf tokens per second; at most 1000000 (one token per microsecond"),
        "{e}"
    );
    let e = error_for("fast.toml", "\"1/s\"", "\"1000001/s\"");
    assert!(e.starts_with("fast.toml:7:10: limit \"per-key\": refill is 1000001 tokens per second; at most 1000000"), "{e}");
}

#[test]
fn a_capacity_above_2_pow_53_is_rejected_not_rounded() {
    // 2^53 + 1 used to be rounded to 2^53 silently.
    let e = error_for("big.toml", "capacity = 5", "capacity = 9007199254740993");
    assert_eq!(
        e,
        "big.toml:6:12: limit \"per-key\": capacity must be at most 2^53 = 9007199254740992, the largest count a double holds exactly"
    );
    let e = numbers_error(
        "big-window.toml",
        "algorithm = \"fixed-window\"\nlimit = 9007199254740993\nwindow = \"1s\"",
        "",
    );
    assert!(
        e.starts_with("big-window.toml:7:9: limit \"per-key\": limit must be at most 2^53"),
        "{e}"
    );
}

#[test]
fn a_burst_spanning_too_long_is_rejected() {
    // The issue's case: 10000 tokens, one per 10^9 s, cost 3000. The lean
    // script's answer (4 × 3 × 10^18 µs) overflowed Redis's integer: requests
    // were charged but answered 429 with a positive Remaining.
    let e = numbers_error(
        "span.toml",
        "capacity = 10000\nrefill = \"1/1000000000s\"",
        "cost = 3000\n",
    );
    assert!(
        e.starts_with("span.toml:7:10: limit \"per-key\": capacity ÷ refill (the time an empty bucket takes to fill) is 1.16e8 days; at most 315360000 s (3650 days, 10 years)"),
        "{e}"
    );
    // The edge: 3650 days to fill loads, one token more does not.
    let edge = "capacity = 315360000\nrefill = \"1/s\"";
    let mut toml = GOOD.replace("capacity = 5\nrefill = \"1/s\"", edge);
    assert!(Config::from_toml_str(&toml).is_ok());
    toml = toml.replace("315360000", "315360001");
    let e = Config::from_toml_str(&toml).unwrap_err().to_string();
    assert!(
        e.starts_with("line 7, column 10: limit \"per-key\": capacity ÷ refill (the time an empty bucket takes to fill) is 315360001 s (3650.0 days); at most 315360000 s"),
        "{e}"
    );
}

#[test]
fn a_window_that_is_not_whole_milliseconds_is_rejected() {
    // Redis counts windows in ms; the in-process store would use 1.5 ms.
    let e = numbers_error(
        "window.toml",
        "algorithm = \"sliding-window\"\nlimit = 10\nwindow = \"1.5ms\"",
        "",
    );
    assert_eq!(
        e,
        "window.toml:8:10: limit \"per-key\": window must be a whole number of milliseconds (Redis counts windows in ms)"
    );
}

#[test]
fn plans_are_bounded_like_limits() {
    let plan = |numbers: &str| format!("\n[plans.pro.per-key]\n{numbers}\n");
    // Line 14: the plan's table, 15: its numbers.
    let e = numbers_error(
        "plan.toml",
        "capacity = 5\nrefill = \"1/s\"",
        &plan("refill = \"1e308/ms\""),
    );
    assert!(
        e.starts_with("plan.toml:15:10: limit \"per-key\": refill is inf tokens per second"),
        "{e}"
    );
    let e = numbers_error(
        "plan.toml",
        "capacity = 5\nrefill = \"1/s\"",
        &plan("capacity = 9007199254740993"),
    );
    assert!(
        e.starts_with("plan.toml:15:12: limit \"per-key\": capacity must be at most 2^53"),
        "{e}"
    );
    // The plan's capacity with the limit's own (inherited) refill.
    let e = numbers_error(
        "plan.toml",
        "capacity = 5\nrefill = \"1/d\"",
        &plan("capacity = 4000"),
    );
    assert!(e.starts_with("plan.toml:15:12: limit \"per-key\": capacity ÷ refill (the time an empty bucket takes to fill) is 345600000 s (4000.0 days); at most 315360000 s"), "{e}");
}

#[test]
fn the_builder_applies_the_same_bounds() {
    use fleetlimit::configuration::KeySource;
    use fleetlimit::configuration::{LimitConfig, Rate, RouteConfig};
    let build = |l: LimitConfig| {
        Config::builder()
            .limit("l", l)
            .route("/", RouteConfig::new(["l"]))
            .build()
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let e = build(LimitConfig::token_bucket(
        KeySource::Global,
        (1 << 53) + 1,
        Rate::per_second(1),
    ))
    .unwrap_err();
    assert!(
        e.starts_with("limit \"l\": capacity must be at most 2^53"),
        "{e}"
    );
    let e = build(LimitConfig::token_bucket(
        KeySource::Global,
        5,
        Rate::per_second(10_000_000),
    ))
    .unwrap_err();
    assert!(
        e.starts_with("limit \"l\": refill is 10000000 tokens per second; at most 1000000"),
        "{e}"
    );
    let e = build(LimitConfig::token_bucket(
        KeySource::Global,
        10_000,
        "1/1000000000s".parse().unwrap(),
    ))
    .unwrap_err();
    assert!(e.starts_with("limit \"l\": capacity ÷ refill"), "{e}");
    let e = build(LimitConfig::fixed_window(
        KeySource::Global,
        5,
        std::time::Duration::from_micros(1500),
    ))
    .unwrap_err();
    assert!(e.contains("whole number of milliseconds"), "{e}");
    let e = build(
        LimitConfig::token_bucket(KeySource::Global, 5, Rate::per_second(1)).plan(
            "pro",
            LimitConfig::token_bucket(KeySource::Global, 5, Rate::per_second(10_000_000)),
        ),
    )
    .unwrap_err();
    assert!(e.starts_with("limit \"l\": refill is 10000000"), "{e}");
    assert!(
        build(LimitConfig::token_bucket(
            KeySource::Global,
            1_000_000,
            Rate::per_second(1_000_000)
        ))
        .is_ok()
    );
}

#[test]
fn a_redis_url_of_an_unknown_scheme() {
    let e = error_for(
        "scheme.toml",
        "\"redis://127.0.0.1:6379\"",
        "\"notaurl://x\"",
    );
    assert!(
        e.starts_with("scheme.toml:2:7: unsupported Redis URL scheme \"notaurl://\""),
        "{e}"
    );
    assert!(
        e.contains("accepted: redis://, rediss://, redis-cluster://, rediss-cluster://, redis-sentinel://, rediss-sentinel://"),
        "{e}"
    );
    // Also what fred cannot use: no port, no sentinel service name.
    let e = error_for(
        "port.toml",
        "\"redis://127.0.0.1:6379\"",
        "\"redis://127.0.0.1:port\"",
    );
    assert!(
        e.starts_with("port.toml:2:7: cannot read the Redis URL"),
        "{e}"
    );
    let e = error_for(
        "sentinel.toml",
        "\"redis://127.0.0.1:6379\"",
        "\"redis-sentinel://127.0.0.1:26379\"",
    );
    assert!(e.starts_with("sentinel.toml:2:7: bad Redis URL"), "{e}");
}

#[test]
fn a_tls_ca_file_needs_a_rediss_url_and_a_readable_file() {
    let e = error_for(
        "ca-plain.toml",
        "url = \"redis://127.0.0.1:6379\"",
        "url = \"redis://127.0.0.1:6379\"\ntls_ca_file = \"/nonexistent/ca.pem\"",
    );
    assert!(
        e.starts_with("ca-plain.toml:3:15: tls_ca_file is set, but the url \"redis://127.0.0.1:6379\" does not use TLS"),
        "{e}"
    );
    #[cfg(feature = "tls")]
    {
        let e = error_for(
            "ca-missing.toml",
            "url = \"redis://127.0.0.1:6379\"",
            "url = \"rediss://127.0.0.1:6379\"\ntls_ca_file = \"/nonexistent/ca.pem\"",
        );
        assert!(
            e.starts_with("ca-missing.toml:3:15: cannot read tls_ca_file /nonexistent/ca.pem"),
            "{e}"
        );
        let not_pem = file_with("not-pem.txt", "hello\n");
        let e = error_for(
            "ca-not-pem.toml",
            "url = \"redis://127.0.0.1:6379\"",
            &format!(
                "url = \"rediss://127.0.0.1:6379\"\ntls_ca_file = \"{}\"",
                not_pem.display()
            ),
        );
        assert!(e.starts_with("ca-not-pem.toml:3:15: tls_ca_file"), "{e}");
        assert!(e.contains("holds no certificate"), "{e}");
        let e = error_for(
            "cert-alone.toml",
            "url = \"redis://127.0.0.1:6379\"",
            "url = \"rediss://127.0.0.1:6379\"\ntls_client_cert = \"/nonexistent/c.pem\"",
        );
        assert_eq!(
            e,
            "cert-alone.toml:3:19: tls_client_cert needs tls_client_key (the certificate's private key)"
        );
        let e = error_for(
            "key-not-pem.toml",
            "url = \"redis://127.0.0.1:6379\"",
            &format!(
                "url = \"rediss://127.0.0.1:6379\"\ntls_client_cert = \"{0}\"\ntls_client_key = \"{0}\"",
                not_pem.display()
            ),
        );
        assert!(
            e.starts_with("key-not-pem.toml:3:19: tls_client_cert"),
            "{e}"
        );
    }
}

#[test]
fn a_breaker_window_not_above_the_deadline() {
    let e = error_for(
        "window.toml",
        "url = \"redis://127.0.0.1:6379\"",
        "url = \"redis://127.0.0.1:6379\"\ndeadline = \"50ms\"\n\n[breaker]\nwindow = \"50ms\"\n",
    );
    assert!(
        e.starts_with(
            "window.toml:6:10: [breaker] window (50ms) must be longer than the deadline (50ms)"
        ),
        "{e}"
    );
}

#[test]
fn the_builder_bounds_durations_like_the_toml() {
    use fleetlimit::configuration::KeySource;
    use fleetlimit::configuration::{LimitConfig, RouteConfig};
    let limit = || LimitConfig::token_bucket(KeySource::Global, 5, "1/s".parse().unwrap());
    // Duration::MAX used to build, then panic on the request path when the
    // breaker first opened (an Instant overflow).
    let e = Config::builder()
        .limit("l", limit())
        .route("/", RouteConfig::new(["l"]))
        .breaker_cool_off(std::time::Duration::MAX)
        .build()
        .unwrap_err()
        .to_string();
    assert_eq!(e, "breaker cool_off is too long: at most 1000000000 s");
    let e = Config::builder()
        .limit("l", limit())
        .deadline(std::time::Duration::MAX)
        .build()
        .unwrap_err()
        .to_string();
    assert_eq!(e, "deadline is too long: at most 1000000000 s");
}

/// The README's `main` returns `Result<(), Box<dyn Error>>` and uses `?`:
/// what it prints (`Error: {:?}`) is the `file:line:col: message` that
/// `Display` and `check-config` show, not the struct's fields.
#[test]
fn debug_prints_what_display_prints() {
    let path = file_with("typo.toml", &GOOD.replace("capacity = 5", "capacty = 5"));
    let err = Config::from_toml_file(&path).unwrap_err();
    let boxed: Box<dyn std::error::Error> = Box::new(err.clone());
    assert_eq!(format!("{boxed:?}"), err.to_string());
    assert!(
        format!("{err:?}").starts_with(&format!("{}:6:1: unknown field `capacty`", path.display())),
        "{err:?}"
    );
    assert!(!format!("{err:?}").contains("ConfigError {"), "{err:?}");
}

/// Bounds in words, and the number as written rather than its 300 digits.
#[test]
fn counts_say_their_bounds_in_words() {
    for (value, shown) in [("1e300", "1e300"), ("-3", "-3"), ("2.5", "2.5")] {
        let e = error_for("count.toml", "capacity = 5", &format!("capacity = {value}"));
        assert_eq!(
            e,
            format!(
                "count.toml:6:12: {shown} is not a whole number from 1 to 2^53 (9007199254740992)"
            )
        );
    }
    let e = error_for(
        "cost.toml",
        "on_redis_error = \"open\"",
        "on_redis_error = \"open\"\ncost = 1e300",
    );
    assert!(
        e.starts_with("cost.toml:13:8: invalid type: floating point `1e300`"),
        "{e}"
    );
    assert!(
        e.contains("expected a whole number from 0 to 4294967295"),
        "{e}"
    );
    assert!(!e.contains("u32"), "{e}");
}

/// Both Retry-After settings follow one rule: whole seconds, at least 1s.
#[test]
fn every_retry_after_is_whole_seconds() {
    let e = error_for(
        "closed.toml",
        "url = \"redis://127.0.0.1:6379\"",
        "url = \"redis://127.0.0.1:6379\"\nclosed_retry_after = \"1ms\"",
    );
    assert_eq!(
        e,
        "closed.toml:3:22: [redis] closed_retry_after must be whole seconds, at least 1s (it is sent as Retry-After), not 1ms"
    );
    let shed = format!("{GOOD}\n[shedding]\nmax_in_flight = 10\nretry_after = \"1ms\"\n");
    let path = file_with("shed.toml", &shed);
    let e = Config::from_toml_file(&path).unwrap_err().to_string();
    assert!(
        e.ends_with("[shedding] retry_after must be whole seconds, at least 1s (it is sent as Retry-After), not 1ms"),
        "{e}"
    );
    let ok = GOOD.replace(
        "url = \"redis://127.0.0.1:6379\"",
        "url = \"redis://127.0.0.1:6379\"\nclosed_retry_after = \"2s\"",
    );
    assert!(Config::from_toml_str(&ok).is_ok());
}

/// A standalone URL without a port is Redis's default port, as every
/// client takes it (docs/configuration.md says so).
#[test]
fn a_standalone_url_without_a_port_is_6379() {
    let cfg = Config::from_toml_str(&GOOD.replace("127.0.0.1:6379", "127.0.0.1")).unwrap();
    assert_eq!(cfg.redis_url(), Some("redis://127.0.0.1"));
    assert!(
        Config::builder()
            .build()
            .unwrap()
            .try_with_redis_url("redis://cache.internal")
            .is_ok()
    );
}

/// Regions and a global limit (`docs/configuration.md`, `[regions]`).
const REGIONS: &str = r#"[redis]
url = "redis://127.0.0.1:6379"

[regions]
this = "eu"
interval = "2s"

[regions.exchange]
eu = "redis://10.0.0.1:6379"
us = "redis://10.1.0.1:6379"
ap = "redis://10.2.0.1:6379"

[limits.per-key]
key = "header:x-api-key"
capacity = 100
refill = "10/s"
scope = "global"
split = { eu = 0.5, us = 0.3, ap = 0.2 }

[[routes]]
path = "/"
limits = ["per-key"]
"#;

/// Loads `REGIONS` with one substitution; returns the error's text.
fn regions_error(name: &str, from: &str, to: &str) -> String {
    assert!(REGIONS.contains(from), "{from}");
    let path = file_with(name, &REGIONS.replacen(from, to, 1));
    let err = Config::from_toml_file(&path).unwrap_err();
    err.to_string().replace(&path.display().to_string(), name)
}

#[test]
fn the_regions_file_loads() {
    let cfg = Config::from_toml_file(file_with("regions.toml", REGIONS)).unwrap();
    let d = cfg.describe();
    assert!(d.contains("regions: this instance in eu;"), "{d}");
    assert!(
        d.contains("global limits: per-key (eu 50%, us 30%, ap 20%)"),
        "{d}"
    );
}

#[test]
fn this_instances_region_is_one_of_them_named_once() {
    let e = regions_error("this.toml", "this = \"eu\"", "this = \"as\"");
    assert_eq!(
        e,
        "this.toml:5:8: this instance's region \"as\" is not in [regions.exchange] (eu, us, ap)"
    );
    let e = regions_error(
        "both.toml",
        "this = \"eu\"",
        "this = \"eu\"\nthis_env = \"REGION\"",
    );
    assert_eq!(
        e,
        "both.toml:6:12: [regions] takes `this` or `this_env`, not both: this instance's region is named once"
    );
    let e = regions_error("neither.toml", "this = \"eu\"\n", "");
    assert!(
        e.starts_with("neither.toml:4:1: [regions] needs `this` (this instance's region, e.g. this = \"eu\") or `this_env`"),
        "{e}"
    );
}

#[test]
fn this_instances_region_from_the_environment() {
    // One variable per case: tests run in parallel.
    let unset = "FLEETLIMIT_TEST_REGION_UNSET";
    let e = regions_error(
        "unset.toml",
        "this = \"eu\"",
        &format!("this_env = \"{unset}\""),
    );
    assert_eq!(
        e,
        format!(
            "unset.toml:5:12: environment variable {unset} ([regions] this_env) is not set; \
             it names this instance's region, one of eu, us, ap"
        )
    );
    // These three are set by .cargo/config.toml ([env]).
    let empty = "FLEETLIMIT_TEST_REGION_EMPTY";
    let e = regions_error(
        "empty.toml",
        "this = \"eu\"",
        &format!("this_env = \"{empty}\""),
    );
    assert!(
        e.starts_with(&format!(
            "empty.toml:5:12: environment variable {empty} ([regions] this_env) is not set"
        )),
        "{e}"
    );
    let mars = "FLEETLIMIT_TEST_REGION_MARS";
    let e = regions_error(
        "mars.toml",
        "this = \"eu\"",
        &format!("this_env = \"{mars}\""),
    );
    assert_eq!(
        e,
        format!(
            "mars.toml:5:12: this instance's region \"mars\" (environment variable {mars}, \
             [regions] this_env) is not in [regions.exchange] (eu, us, ap)"
        )
    );
    let us = "FLEETLIMIT_TEST_REGION_US";
    let src = REGIONS.replace("this = \"eu\"", &format!("this_env = \"{us}\""));
    let cfg = Config::from_toml_str(&src).unwrap();
    assert!(cfg.describe().contains("regions: this instance in us;"));
}

#[test]
fn regions_are_two_or_more_each_named_once_with_a_redis_url() {
    let e = regions_error(
        "one.toml",
        "us = \"redis://10.1.0.1:6379\"\nap = \"redis://10.2.0.1:6379\"\n",
        "",
    );
    assert_eq!(
        e,
        "one.toml:8:1: [regions.exchange] names 1 region (eu); a global limit needs at least two, \
         each with the Redis URL this region's exchange reaches it by"
    );
    let e = regions_error("name.toml", "us = ", "\"u:s\" = ");
    assert_eq!(
        e,
        "name.toml:10:1: region name \"u:s\" must be 1 to 64 characters of letters, digits, '-', '_' or '.'"
    );
    let e = regions_error("url.toml", "\"redis://10.2.0.1:6379\"", "\"notaurl://x\"");
    assert!(
        e.starts_with(
            "url.toml:11:6: [regions.exchange] ap: unsupported Redis URL scheme \"notaurl://\""
        ),
        "{e}"
    );
    let e = regions_error("port.toml", "10.1.0.1:6379", "10.1.0.1:port");
    assert!(
        e.starts_with("port.toml:10:6: [regions.exchange] us: cannot read the Redis URL"),
        "{e}"
    );
    // A region twice is the toml parser's error, at the second.
    let e = regions_error("twice.toml", "ap = ", "eu = ");
    assert!(e.starts_with("twice.toml:11:1: duplicate key `eu`"), "{e}");
}

#[test]
fn the_interval_is_100ms_to_60s() {
    let e = regions_error("fast.toml", "\"2s\"", "\"50ms\"");
    assert_eq!(
        e,
        "fast.toml:6:12: [regions] interval is 50ms; it must be between 100ms and 1min \
         (how often quotas move between regions)"
    );
    let e = regions_error("slow.toml", "\"2s\"", "\"61s\"");
    assert!(
        e.starts_with("slow.toml:6:12: [regions] interval is 61s;"),
        "{e}"
    );
    for ok in ["100ms", "60s"] {
        let src = REGIONS.replace("\"2s\"", &format!("{ok:?}"));
        assert!(Config::from_toml_str(&src).is_ok(), "{ok}");
    }
    // Unset: 2s.
    let cfg = Config::from_toml_str(&REGIONS.replace("interval = \"2s\"\n", "")).unwrap();
    assert!(cfg.describe().contains("quotas move every 2s"));
}

#[test]
fn regions_need_redis_and_global_limits_need_regions() {
    let e = regions_error(
        "memory.toml",
        "[redis]\nurl = \"redis://127.0.0.1:6379\"\n",
        "",
    );
    assert_eq!(
        e,
        "memory.toml:2:1: [regions] needs the Redis store (a [redis] section, or \
         ConfigBuilder::redis_url): each region decides its share of a global limit in its own Redis"
    );
    let (head, rest) = REGIONS.split_once("[regions]").unwrap();
    let limits = &rest[rest.find("[limits").unwrap()..];
    let path = file_with(
        "no-regions.toml",
        &format!("{head}{limits}").replace("split = { eu = 0.5, us = 0.3, ap = 0.2 }\n", ""),
    );
    let e = Config::from_toml_file(&path).unwrap_err();
    assert_eq!((e.line(), e.column()), (Some(8), Some(9)), "{e}");
    assert_eq!(
        e.message(),
        "limit \"per-key\": scope = \"global\" needs [regions] (this instance's region and \
         every region that shares the limit)"
    );
}

#[test]
fn a_global_limit_is_a_token_bucket_without_leases_or_plans() {
    let e = regions_error(
        "window.toml",
        "capacity = 100\nrefill = \"10/s\"",
        "algorithm = \"sliding-window\"\nlimit = 100\nwindow = \"10s\"",
    );
    assert_eq!(
        e,
        "window.toml:18:9: limit \"per-key\": scope = \"global\" supports token buckets only: \
         a window's count cannot change hands mid-window, and concurrency slots are not split \
         across regions"
    );
    let e = regions_error(
        "slots.toml",
        "capacity = 100\nrefill = \"10/s\"",
        "algorithm = \"concurrency\"\nmax_in_flight = 10",
    );
    assert!(
        e.starts_with(
            "slots.toml:17:9: limit \"per-key\": scope = \"global\" supports token buckets only"
        ),
        "{e}"
    );
    let e = regions_error(
        "lease.toml",
        "refill = \"10/s\"",
        "refill = \"10/s\"\nlease_batch = 10",
    );
    assert_eq!(
        e,
        "lease.toml:17:15: limit \"per-key\": hot-key leases (lease_batch) are not supported on a \
         global limit (scope = \"global\")"
    );
    let path = file_with(
        "plan.toml",
        &format!("{REGIONS}\n[plans.pro.per-key]\ncapacity = 200\n"),
    );
    let e = Config::from_toml_file(&path).unwrap_err().to_string();
    assert_eq!(
        e.replace(&path.display().to_string(), "plan.toml"),
        "plan.toml:24:12: limit \"per-key\": plans are not supported on a global limit \
         (scope = \"global\") yet: remove [plans.pro.per-key] or the limit's scope"
    );
}

#[test]
fn a_split_names_known_regions_with_fractions_adding_up_to_1_at_most() {
    let e = regions_error("unknown.toml", "ap = 0.2", "as = 0.2");
    assert_eq!(
        e,
        "unknown.toml:18:31: limit \"per-key\": split names region \"as\", which is not in \
         [regions.exchange] (eu, us, ap)"
    );
    for (weight, shown) in [("-0.2", "-0.2"), ("nan", "NaN"), ("inf", "inf")] {
        let e = regions_error("weight.toml", "ap = 0.2", &format!("ap = {weight}"));
        assert_eq!(
            e,
            format!(
                "weight.toml:18:36: limit \"per-key\": split: the weight of region \"ap\" is \
                 {shown}; it must be a number from 0 to 1 (its fraction of the limit)"
            )
        );
    }
    let e = regions_error("sum.toml", "ap = 0.2", "ap = 0.3");
    assert_eq!(
        e,
        "sum.toml:18:9: limit \"per-key\": split: the weights add up to 1.1; at most 1 \
         (the regions' shares of a global limit never add up to more than the limit)"
    );
    let e = regions_error("regional.toml", "scope = \"global\"\n", "");
    assert_eq!(
        e,
        "regional.toml:17:9: limit \"per-key\": `split` needs `scope = \"global\"` (it shares a \
         global limit between regions)"
    );
    let e = regions_error("scope.toml", "\"global\"", "\"world\"");
    assert!(
        e.starts_with("scope.toml:17:9: unknown variant `world`, expected `region` or `global`"),
        "{e}"
    );
    // Under 1 is allowed: the rest is no region's until quotas move.
    let src = REGIONS.replace("ap = 0.2", "ap = 0.1");
    assert!(Config::from_toml_str(&src).is_ok());
}

/// `GOOD` with a `[[descriptors]]` entry (Envoy's rate limit service)
/// whose `entries` line is `entries`, and more below it.
fn descriptor_error(name: &str, entries: &str, more: &str) -> String {
    let src = format!(
        "{GOOD}\n[[descriptors]]\ndomain = \"edge\"\n{entries}\nlimits = [\"per-key\"]\n{more}"
    );
    let path = file_with(name, &src);
    let err = Config::from_toml_file(&path).unwrap_err();
    err.to_string().replace(&path.display().to_string(), name)
}

#[test]
fn descriptors_fail_at_start_up_where_written() {
    let good = r#"entries = [{ key = "api_key", as = "header:x-api-key" }]"#;
    assert!(
        Config::from_toml_file(file_with(
            "d.toml",
            &format!(
                "{GOOD}\n[[descriptors]]\ndomain = \"edge\"\n{good}\nlimits = [\"per-key\"]\n"
            )
        ))
        .is_ok()
    );
    let cases = [
        (
            r#"entries = [{ key = "api_key" }]"#,
            "",
            "neither.toml:16:12: entry \"api_key\" needs `value` (the value it must have) or `as`",
        ),
        (
            r#"entries = [{ key = "api_key", as = "cookie:sid" }]"#,
            "",
            "as.toml:16:36: entry \"api_key\": `as = \"cookie:sid\"` must be \"ip\", \"header:<name>\" or \"account\"",
        ),
        (
            r#"entries = [{ key = "remote_address", as = "ip" }]"#,
            "",
            "provides.toml:17:11: limit \"per-key\" is keyed by header x-api-key, which no entry of this descriptor provides",
        ),
        (
            r#"entries = [{ key = "k", value = "v", as = "ip" }]"#,
            "",
            "both.toml:16:43: entry \"k\" has both `value` and `as`: give one",
        ),
        (
            good,
            "path = \"/\"\n",
            "field.toml:18:1: unknown field `path`",
        ),
        (
            good,
            "\n[[descriptors]]\ndomain = \"edge\"\nentries = [{ key = \"api_key\", as = \"header:x-api-key\" }]\nlimits = []\n",
            "twice.toml:19:1: descriptor edge [api_key=as header:x-api-key] is listed twice",
        ),
    ];
    let names = [
        "neither.toml",
        "as.toml",
        "provides.toml",
        "both.toml",
        "field.toml",
        "twice.toml",
    ];
    for ((entries, more, want), name) in cases.into_iter().zip(names) {
        let e = descriptor_error(name, entries, more);
        assert!(e.starts_with(want), "{name}: {e}");
    }
    let src = format!("{GOOD}\n[[descriptors]]\ndomain = \"\"\n{good}\nlimits = [\"per-key\"]\n");
    let path = file_with("domain.toml", &src);
    let e = Config::from_toml_file(&path).unwrap_err().to_string();
    let e = e.replace(&path.display().to_string(), "domain.toml");
    assert_eq!(e, "domain.toml:15:10: domain must not be empty");
    // What needs the request's end or its handler cannot be a
    // descriptor's: Envoy's protocol says nothing after its answer.
    let src = format!(
        "{}\n[limits.slots]\nkey = \"header:x-api-key\"\nalgorithm = \"concurrency\"\nmax_in_flight = 5\n\
         \n[[descriptors]]\ndomain = \"edge\"\n{good}\nlimits = [\"per-key\", \"slots\"]\n",
        GOOD
    );
    let path = file_with("slots.toml", &src);
    let e = Config::from_toml_file(&path).unwrap_err().to_string();
    let e = e.replace(&path.display().to_string(), "slots.toml");
    assert!(
        e.starts_with("slots.toml:22:22: limit \"slots\" counts requests in flight"),
        "{e}"
    );
}
