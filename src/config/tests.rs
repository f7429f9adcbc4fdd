//! Unit tests of the schema and its validation.

use super::*;
use crate::key::KeySource;
use crate::route::OnMissing;

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

#[cfg(feature = "redis")]
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

#[cfg(feature = "redis")]
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
            LimitConfig::token_bucket(KeySource::ClientIp, 10, Rate::per_second(1)),
        )
        .default_route(RouteConfig::new(["ip"]).refund())
        .build()
        .unwrap();
    assert!(ok.redis.is_none());
    assert!(ok.default_route.as_ref().is_some_and(|p| p.refund));
}

#[cfg(feature = "redis")]
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
            crate::key::KeySource::header("x-api-key"),
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

#[cfg(feature = "redis")]
/// Every option, once in TOML and once through the builder: the two front
/// doors must give the same configuration (TLS files aside: they must exist).
#[test]
fn the_builder_reaches_every_option_the_toml_has() {
    // Set by .cargo/config.toml ([env]): a test setting it would race the others.
    const SECRET_VAR: &str = "FLEETLIMIT_TEST_EVERY_OPTION_SECRET";
    let toml = Config::from_toml_str(&format!(
        r#"
[redis]
url = "redis://127.0.0.1:1"
pool_size = 3
deadline = "7ms"
connect_timeout = "3s"
key_prefix = "app"
closed_retry_after = "2s"
refused_cache_keys = 500
coalesce = false

[fleet]
size = 3
discover = true
heartbeat = "2s"
dead_after = "9s"

[client_ip]
trusted_proxies = ["10.0.0.0/8", "192.168.1.1"]
forwarded_header = "forwarded"
ipv6_prefix = 56

[memory]
max_keys = 1000

[breaker]
failures = 5
window = "200ms"
cool_off = "1s"
probes = 2

[keys]
secret_env = "{SECRET_VAR}"

[limits.per-key]
key = "header:x-api-key"
on_missing = "ip"
capacity = 50
refill = "10/s"
lease_batch = 10
lease_above = 20

[limits.api]
key = "ip"
algorithm = "sliding-window"
limit = 100
window = "60s"
mode = "shadow"

[plans.pro.api]
limit = 500

[plan_assignments]
"k1" = "pro"

[plan_cache]
ttl = "10s"
max_keys = 77

[[routes]]
path = "/search"
methods = ["GET", "post"]
limits = ["per-key", "api"]
cost = 2
on_redis_error = "local"
mode = "shadow"
refund = true

[default]
limits = ["per-key"]
on_redis_error = "closed"
"#
    ))
    .unwrap();
    let ms = Duration::from_millis;
    let built = Config::builder()
        .redis_url("redis://127.0.0.1:1")
        .pool_size(3)
        .deadline(ms(7))
        .connect_timeout(ms(3000))
        .key_prefix("app")
        .closed_retry_after(ms(2000))
        .refused_cache_keys(500)
        .coalesce(false)
        .fleet_size(3)
        .heartbeat(ms(2000), ms(9000))
        .trusted_proxies([
            "10.0.0.0/8".parse().unwrap(),
            "192.168.1.1/32".parse().unwrap(),
        ])
        .forwarded_rfc7239()
        .ipv6_prefix(56)
        .memory_max_keys(1000)
        .breaker_failures(5)
        .breaker_window(ms(200))
        .breaker_cool_off(ms(1000))
        .breaker_probes(2)
        .key_secret_env(SECRET_VAR)
        .limit(
            "api",
            LimitConfig::sliding_window(KeySource::ClientIp, 100, ms(60_000))
                .shadow()
                .plan(
                    "pro",
                    LimitConfig::sliding_window(KeySource::ClientIp, 500, ms(60_000)),
                ),
        )
        .limit(
            "per-key",
            LimitConfig::token_bucket(KeySource::header("x-api-key"), 50, Rate::per_second(10))
                .missing_by_ip()
                .lease(10, 20),
        )
        .assign_plan("k1", "pro")
        .plan_cache_ttl(ms(10_000))
        .plan_cache_keys(77)
        .route(
            "/search",
            RouteConfig::new(["per-key", "api"])
                .methods([Method::GET, Method::POST])
                .cost(2)
                .on_redis_error(FailurePolicy::Local)
                .shadow()
                .refund(),
        )
        .default_route(RouteConfig::new(["per-key"]).on_redis_error(FailurePolicy::Closed))
        .build()
        .unwrap();
    assert_eq!(toml.describe(), built.describe());
    // Debug shows every field but the hidden ones, compared after.
    assert_eq!(format!("{toml:#?}"), format!("{built:#?}"));
    assert_eq!(toml.plan_assignments, built.plan_assignments);
    assert!(format!("{toml:?}").contains("coalesce: false"), "{toml:?}");
    assert!(
        format!("{toml:?}").contains("batch: 10, above: 20"),
        "{toml:?}"
    );
}

#[cfg(feature = "redis")]
#[test]
fn the_builders_new_options_are_checked_as_in_toml() {
    let msg = |b: ConfigBuilder| b.build().unwrap_err().message().to_owned();
    let zero = Duration::ZERO;
    // Sent as Retry-After, as [shedding] retry_after is (issue 25, item 6).
    let m = msg(Config::builder().closed_retry_after(zero));
    assert!(
        m.contains("[redis] closed_retry_after must be whole seconds, at least 1s"),
        "{m}"
    );
    let m = msg(Config::builder().closed_retry_after(Duration::from_millis(1)));
    assert!(
        m.contains("at least 1s (it is sent as Retry-After), not 1ms"),
        "{m}"
    );
    let m = msg(Config::builder().connect_timeout(zero));
    assert!(
        m.contains("connect_timeout must be longer than zero"),
        "{m}"
    );
    let m = msg(Config::builder().plan_cache_keys(0));
    assert!(m.contains("max_keys must be at least 1"), "{m}");
    let m = msg(Config::builder().ipv6_prefix(129));
    assert!(m.contains("ipv6_prefix must be between 0 and 128"), "{m}");
    let m = msg(Config::builder().key_secret_env("FLEETLIMIT_TEST_UNSET_SECRET_VAR"));
    assert!(m.contains("is not set"), "{m}");
    let bucket = LimitConfig::token_bucket(KeySource::ClientIp, 5, Rate::per_second(1));
    let m = msg(Config::builder().limit("l", bucket.lease(6, 50)));
    assert!(
        m.contains("lease_batch must be between 2 and the capacity"),
        "{m}"
    );
}

/// What only a file can write wrong (`build.rs`, `validate/limit.rs`) and the
/// settings `validate/settings.rs` and `validate/shedding.rs` check: each
/// error at the value that is wrong, in the same words wherever it was
/// raised before.
#[test]
fn every_check_points_at_what_is_wrong() {
    const LIMIT: &str = "[limits.a]\nkey = \"ip\"\ncapacity = 5\nrefill = \"1/s\"\n";
    let cases: [(String, (usize, usize), &str); 8] = [
        (
            "[fleet]\nheartbeat = \"1s\"\n".into(),
            (2, 13),
            "heartbeat settings need `discover = true`",
        ),
        (
            format!("{LIMIT}lease_above = 3\n"),
            (5, 15),
            "lease_above needs lease_batch",
        ),
        (
            format!("{LIMIT}failure_statuses = [401]\n"),
            (5, 20),
            "limit \"a\": `failure_statuses` needs `count = \"failures\"`",
        ),
        (
            format!("{LIMIT}delay = \"2s\"\n"),
            (5, 9),
            "limit \"a\": `delay` needs `on_exceed = \"delay\"`",
        ),
        (
            format!("{LIMIT}window = \"1s\"\n"),
            (5, 10),
            "limit \"a\": `window` does not apply to a token bucket (use `refill`)",
        ),
        (
            format!("{LIMIT}\n[plan_assignments]\n\"k\" = \"gold\"\n"),
            (7, 7),
            "unknown plan \"gold\" (defined under [plans]: [])",
        ),
        (
            "[keys]\nwww_authenticate = \"Bad/Scheme\"\n".into(),
            (2, 20),
            "www_authenticate \"Bad/Scheme\" must start with an auth-scheme",
        ),
        (
            "[shedding]\nqueue_delay_target = \"10ms\"\nqueue_delay_interval = \"5ms\"\n".into(),
            (3, 24),
            "[shedding] queue_delay_interval must be longer than queue_delay_target",
        ),
    ];
    for (src, (line, column), message) in cases {
        let e = err(&src);
        assert_eq!((e.line(), e.column()), (Some(line), Some(column)), "{e}");
        assert!(e.message().starts_with(message), "{e}");
    }
    let e = err("[limits.a]\nkey = \"ip\"\ncapacity = 5\n");
    assert_eq!(e.message(), "limit \"a\": missing `refill`");
}

/// `[regions]` and two global limits (line numbers are the errors' in
/// `tests/config_errors.rs`).
#[cfg(feature = "redis")]
const REGIONS: &str = r#"[redis]
url = "redis://127.0.0.1:6379"

[regions]
this = "us"
interval = "500ms"

[regions.exchange]
eu = "redis://:eu-secret@10.0.0.1:6379"
us = "redis://10.1.0.1:6379"
ap = "redis://10.2.0.1:6379"

[limits.per-key]
key = "header:x-api-key"
capacity = 100
refill = "10/s"
scope = "global"
split = { eu = 0.1, ap = 0.7, us = 0.2 }

[limits.equal]
key = "ip"
capacity = 10
refill = "1/s"
scope = "global"

[limits.here]
key = "ip"
capacity = 10
refill = "1/s"
scope = "region"
"#;

#[cfg(feature = "redis")]
#[test]
fn regions_and_global_limits_become_their_runtime_types() {
    use crate::config::Regions;
    use crate::route::Global;
    let c = Config::from_toml_str(REGIONS).unwrap();
    let names: Box<[Arc<str>]> = ["eu", "us", "ap"].map(Arc::from).into();
    let links: Box<[String]> = [
        "redis://:eu-secret@10.0.0.1:6379",
        "redis://10.1.0.1:6379",
        "redis://10.2.0.1:6379",
    ]
    .map(String::from)
    .into();
    // In the order written, `this` an index into them.
    let regions = Regions {
        this: 1,
        names,
        links,
        interval: Duration::from_millis(500),
    };
    assert_eq!(c.regions, Some(regions));
    let global = |name: &str| {
        c.limits
            .iter()
            .find(|l| &*l.name == name)
            .unwrap()
            .global
            .clone()
    };
    let split = |s: [u32; 3]| Some(Global { split: s.into() });
    // Floored to parts per million, in the regions' order: 0.1 + 0.2 + 0.7
    // is 1.0000000000000002 as doubles, and exactly the whole limit here.
    assert_eq!(global("per-key"), split([100_000, 200_000, 700_000]));
    assert_eq!(global("equal"), split([333_333; 3]));
    assert_eq!(global("here"), None);
    // A region the split does not name starts with nothing.
    let c = Config::from_toml_str(&REGIONS.replace("ap = 0.7, ", "")).unwrap();
    let per_key = c.limits.iter().find(|l| &*l.name == "per-key").unwrap();
    assert_eq!(per_key.global, split([100_000, 200_000, 0]));
    // Described in a line each, the exchange URLs' passwords hidden, as
    // in Debug.
    let d = c.describe();
    assert!(
        d.contains(
            "\nregions: this instance in us; exchange with eu redis://:***@10.0.0.1:6379, \
             us redis://10.1.0.1:6379, ap redis://10.2.0.1:6379; quotas move every 500ms\n"
        ),
        "{d}"
    );
    assert!(
        d.contains("\nglobal limits: equal (eu 33.3333%, us 33.3333%, ap 33.3333%), per-key (eu 10%, us 20%, ap 0%)\n"),
        "{d}"
    );
    assert!(d.contains("limit per-key: key header:x-api-key"), "{d}");
    assert!(d.contains(", scope global"), "{d}");
    assert!(!d.contains("eu-secret"), "{d}");
    assert!(!format!("{c:?}").contains("eu-secret"), "{c:?}");
    let regions = Config::builder()
        .this_region("eu")
        .region("eu", "redis://:eu-secret@h:1")
        .regions;
    assert!(!format!("{regions:?}").contains("eu-secret"), "{regions:?}");
    // No [regions]: one region, as ever.
    assert_eq!(Config::from_toml_str(GOOD).unwrap().regions, None);
}

#[cfg(feature = "redis")]
#[test]
fn this_region_may_come_from_the_environment() {
    // Set by .cargo/config.toml ([env]).
    const VAR: &str = "FLEETLIMIT_TEST_THIS_REGION_AP";
    let src = REGIONS.replace("this = \"us\"", &format!("this_env = \"{VAR}\""));
    let c = Config::from_toml_str(&src).unwrap();
    assert_eq!(c.regions.as_ref().map(|r| r.this), Some(2));
    let built = Config::builder()
        .redis_url("redis://127.0.0.1:6379")
        .this_region_env(VAR)
        .region("eu", "redis://10.0.0.1:6379")
        .region("ap", "redis://10.2.0.1:6379")
        .build()
        .unwrap();
    assert_eq!(built.regions.map(|r| r.this), Some(1));
}

#[cfg(feature = "redis")]
#[test]
fn the_builder_refuses_what_a_file_cannot_write() {
    let regions = || {
        Config::builder()
            .this_region("eu")
            .region("eu", "redis://10.0.0.1:6379")
            .region("us", "redis://10.1.0.1:6379")
    };
    let limit = || LimitConfig::token_bucket(KeySource::ClientIp, 10, Rate::per_second(1));
    let msg = |b: ConfigBuilder| {
        b.redis_url("redis://127.0.0.1:6379")
            .build()
            .unwrap_err()
            .message()
            .to_owned()
    };
    // A TOML table cannot hold a key twice; the builder is told so.
    let m = msg(regions().region("eu", "redis://h:1"));
    assert_eq!(m, "region \"eu\" is given twice");
    let twice = limit().global_split([("eu", 0.2), ("eu", 0.3)]);
    let m = msg(regions().limit("l", twice));
    assert_eq!(m, "limit \"l\": split names region \"eu\" twice");
    // What a file can write is refused alike.
    let m = msg(regions().region_interval(Duration::from_secs(61)));
    assert!(
        m.starts_with("[regions] interval is 61s; it must be between 100ms and 1min"),
        "{m}"
    );
    let nan = limit().global_split([("eu", f64::NAN)]);
    let m = msg(regions().limit("l", nan));
    assert!(
        m.starts_with("limit \"l\": split: the weight of region \"eu\" is NaN"),
        "{m}"
    );
    let m = msg(Config::builder().limit("l", limit().global()));
    assert!(
        m.starts_with("limit \"l\": scope = \"global\" needs [regions]"),
        "{m}"
    );
    let leased = limit().lease(2, 10).global();
    let m = msg(regions().limit("l", leased));
    assert!(
        m.starts_with("limit \"l\": hot-key leases (lease_batch) are not supported"),
        "{m}"
    );
    let planned = limit().plan("pro", limit()).global();
    let m = msg(regions().limit("l", planned));
    assert!(m.starts_with("limit \"l\": plans are not supported on a global limit (scope = \"global\") yet: remove [plans.pro.l]"), "{m}");
    let m = regions().build().unwrap_err();
    assert!(
        m.message().starts_with("[regions] needs the Redis store"),
        "{m}"
    );
    // And an empty split gives nothing to anyone.
    let none = limit().global_split(Vec::<(String, f64)>::new());
    let m = msg(regions().limit("l", none));
    assert!(
        m.starts_with("limit \"l\": split gives no region any share"),
        "{m}"
    );
}

// The removed `RegionsConfig` example: two regions and a limit split
// 60/40 between them build, with the weights and interval given.
#[cfg(feature = "redis")]
#[test]
fn a_global_split_between_two_regions_builds_with_its_weights() {
    let per_key =
        LimitConfig::token_bucket(KeySource::header("x-api-key"), 100, Rate::per_second(10))
            .global_split([("eu", 0.6), ("us", 0.4)]);
    let c = Config::builder()
        .redis_url("redis://10.0.0.1:6379")
        .this_region("eu")
        .region("eu", "redis://10.0.0.1:6379")
        .region("us", "redis://10.1.0.1:6379")
        .region_interval(Duration::from_secs(5))
        .limit("per-key", per_key)
        .default_route(RouteConfig::new(["per-key"]))
        .build()
        .unwrap();
    let r = c.regions.as_ref().unwrap();
    assert_eq!((r.this, r.interval), (0, Duration::from_secs(5)));
    assert_eq!(&*r.names, [Arc::from("eu"), Arc::from("us")]);
    let d = c.describe();
    assert!(d.contains("per-key (eu 60%, us 40%)"), "{d}");
}

// The removed `RegionsConfig::from_env` example: an unset variable fails
// the build, and the error names it.
#[cfg(feature = "redis")]
#[test]
fn an_unset_region_variable_fails_the_build_by_name() {
    const VAR: &str = "FLEETLIMIT_REGION_UNSET_IN_THIS_TEST";
    let err = Config::builder()
        .redis_url("redis://10.0.0.1:6379")
        .this_region_env(VAR)
        .region("eu", "redis://10.0.0.1:6379")
        .region("us", "redis://10.1.0.1:6379")
        .build()
        .unwrap_err();
    let m = err.message();
    assert!(m.contains("is not set") && m.contains(VAR), "{m}");
}

// The removed `BreakerConfig { cool_off, ..default() }` example: the
// setter changes the cool-off only.
#[test]
fn breaker_cool_off_leaves_the_other_breaker_settings_at_their_defaults() {
    let default = Config::builder().build().unwrap().breaker;
    let c = Config::builder()
        .breaker_cool_off(Duration::from_secs(1))
        .build()
        .unwrap();
    assert_ne!(default.cool_off, Duration::from_secs(1));
    assert_eq!(
        c.breaker,
        BreakerConfig {
            cool_off: Duration::from_secs(1),
            ..default
        }
    );
}

// The removed `ForwardedHeader::Forwarded` example: trusted proxies'
// client chain is read from `Forwarded` only when asked.
#[test]
fn forwarded_rfc7239_switches_the_trusted_proxies_header() {
    use crate::key::ForwardedHeader;
    let proxies = || Config::builder().trusted_proxies(["10.0.0.0/8".parse().unwrap()]);
    let c = proxies().forwarded_rfc7239().build().unwrap();
    assert_eq!(c.client_ip.header, ForwardedHeader::Forwarded);
    assert_eq!(
        c.client_ip.trusted,
        ["10.0.0.0/8".parse::<ipnet::IpNet>().unwrap()]
    );
    let c = proxies().build().unwrap();
    assert_eq!(c.client_ip.header, ForwardedHeader::XForwardedFor);
}

// The removed `RecordConfig` example: 50 000 decisions, 2 hours.
#[test]
fn record_max_len_and_max_age_reach_the_built_limit() {
    use crate::route::RecordConfig;
    let bucket =
        || LimitConfig::token_bucket(KeySource::header("x-api-key"), 50, Rate::per_second(10));
    let record =
        |l: LimitConfig| Config::builder().limit("api", l).build().unwrap().limits[0].record;
    assert_eq!(
        record(
            bucket()
                .record_max_len(50_000)
                .record_max_age(Duration::from_secs(7200))
        ),
        Some(RecordConfig {
            max_len: 50_000,
            max_age: Duration::from_secs(7200)
        })
    );
    assert_eq!(record(bucket().record()), Some(RecordConfig::default()));
    assert_eq!(record(bucket()), None);
}

// The removed `OnMissing::Ip` example: `missing_by_ip` is `on_missing = "ip"`.
#[test]
fn missing_by_ip_counts_keyless_requests_by_ip() {
    let bucket =
        || LimitConfig::token_bucket(KeySource::header("x-api-key"), 10, Rate::per_second(1));
    let on_missing = |l: LimitConfig| {
        Config::builder()
            .limit("per-key", l)
            .build()
            .unwrap()
            .limits[0]
            .on_missing
    };
    assert_eq!(on_missing(bucket().missing_by_ip()), OnMissing::Ip);
    assert_eq!(on_missing(bucket()), OnMissing::Reject);
}
