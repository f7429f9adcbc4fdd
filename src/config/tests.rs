//! Unit tests of the schema and its validation.

use super::*;
use crate::key::KeySource;

const GOOD: &str = r#"
[redis]
url = "redis://127.0.0.1:1"
deadline = "7ms"

[fleet]
size = 3

[limits.per-key]
key = "header:x-api-key"
on_missing = "ip"
capacity = 5
refill = "1/s"

[[routes]]
path = "/search"
methods = ["get"]
limits = ["per-key"]
cost = 2
on_redis_error = "local"
"#;

#[test]
fn parses_a_good_file() {
    let c = Config::from_toml_str(GOOD).unwrap();
    assert_eq!(c.deadline, Duration::from_millis(7));
    assert_eq!(c.fleet_size, 3);
    assert_eq!(c.routes[0].policy.cost, 2);
    assert_eq!(c.routes[0].methods.as_deref(), Some(&[Method::GET][..]));
    assert_eq!(c.limits[0].on_missing, OnMissing::Ip);
    assert!(c.describe().contains("route GET /search"));
    // Refund handles are opt-in per route.
    assert!(!c.routes[0].policy.refund);
    let c = Config::from_toml_str(&GOOD.replace("cost = 2", "cost = 2\nrefund = true")).unwrap();
    assert!(c.routes[0].policy.refund);
    assert!(c.describe().contains(", refund"), "{}", c.describe());
    let e = err(&GOOD.replace("cost = 2", "cost = 2\nrefund = \"yes\""));
    assert!(e.message().contains("expected a boolean"), "{e}");
    assert_eq!((e.line(), e.column()), (Some(20), Some(10)), "{e}");
}

fn err(src: &str) -> ConfigError {
    Config::from_toml_str(src).unwrap_err()
}

#[test]
fn errors_name_line_and_column() {
    let e = err(&GOOD.replace("capacity = 5", "capacty = 5"));
    assert!(e.message().contains("unknown field `capacty`"), "{e}");
    assert_eq!((e.line(), e.column()), (Some(12), Some(1)), "{e}");

    let e = err(&GOOD.replace("limits = [\"per-key\"]", "limits = [\"per-kye\"]"));
    assert!(e.message().contains("unknown limit \"per-kye\""), "{e}");
    assert_eq!((e.line(), e.column()), (Some(18), Some(11)), "{e}");

    let e = err(&GOOD.replace("\"1/s\"", "\"10/fortnight\""));
    assert!(e.message().contains("fortnight"), "{e}");
    assert_eq!((e.line(), e.column()), (Some(13), Some(10)), "{e}");

    let e = err(&GOOD.replace("capacity = 5", "capacity = 0"));
    assert!(e.message().contains("capacity must be at least 1"), "{e}");
    assert_eq!((e.line(), e.column()), (Some(12), Some(12)), "{e}");

    let e = err(&GOOD.replace("cost = 2", "cost = 6"));
    assert!(e.message().contains("capacity 5"), "{e}");

    let e = err(&GOOD.replace("\"local\"", "\"sometimes\""));
    assert!(e.message().contains("unknown variant `sometimes`"), "{e}");
    assert_eq!(e.line(), Some(20), "{e}");
}

#[test]
fn builder_validates_too() {
    let e = Config::builder()
        .route("/", RouteConfig::new(["nope"]))
        .build()
        .unwrap_err();
    assert!(e.message().contains("unknown limit \"nope\""), "{e}");
    let ok = Config::builder()
        .limit(
            "ip",
            LimitConfig::token_bucket(KeySource::ClientIp, 10, Rate::per_second(1.0)),
        )
        .default_route(RouteConfig::new(["ip"]).refund())
        .build()
        .unwrap();
    assert!(ok.redis.is_none());
    assert!(ok.default_route.as_ref().is_some_and(|p| p.refund));
}

#[test]
fn builder_applies_the_loaders_numeric_rules() {
    let msg = |b: ConfigBuilder| b.build().unwrap_err().message().to_owned();
    assert!(msg(Config::builder().pool_size(0)).contains("pool_size must be at least 1"));
    assert!(msg(Config::builder().deadline(Duration::ZERO)).contains("deadline must be longer"));
    assert!(msg(Config::builder().memory_max_keys(0)).contains("max_keys must be at least 1"));
    let second = Duration::from_secs(1);
    assert!(msg(Config::builder().heartbeat(Duration::ZERO, second)).contains("heartbeat must be"));
    assert!(msg(Config::builder().heartbeat(second, second)).contains("dead_after must be longer"));
}

#[test]
fn a_key_secret_set_in_code_must_be_long_enough_and_is_never_printed() {
    let limit = || {
        crate::config::LimitConfig::token_bucket(
            crate::KeySource::header("x-api-key"),
            5,
            "1/s".parse().unwrap(),
        )
    };
    let err = Config::builder()
        .key_secret("short")
        .limit("l", limit())
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("at least 16"), "{err}");
    let builder = Config::builder()
        .key_secret("a secret of 16+ bytes")
        .limit("l", limit());
    // Not as text, and not as the bytes a derived Debug would list.
    let shown = format!("{builder:?}");
    assert!(
        !shown.contains("a secret of") && !shown.contains("97, 32, 115"),
        "{shown}"
    );
    let cfg = builder.build().unwrap();
    assert!(
        cfg.describe().contains("the secret set in code"),
        "{}",
        cfg.describe()
    );
    assert!(!format!("{cfg:?}").contains("a secret of"), "{cfg:?}");
    let default = Config::builder().limit("l", limit()).build().unwrap();
    assert!(
        default.describe().contains("not secret"),
        "{}",
        default.describe()
    );
}

#[test]
fn callers_api_keys_in_plan_assignments_are_never_printed() {
    let cfg = Config::from_toml_str(
        r#"
[limits.api]
key = "header:x-api-key"
capacity = 100
refill = "100/min"

[plans.pro.api]
capacity = 500

[plan_assignments]
"sk_live_SECRET123" = "pro"
"#,
    )
    .unwrap();
    let shown = format!("{cfg:?}");
    assert!(!shown.contains("sk_live"), "{shown}");
    let builder = Config::builder().assign_plan("sk_live_SECRET123", "pro");
    let shown = format!("{builder:?}");
    assert!(!shown.contains("sk_live"), "{shown}");
}
