//! The evidence that settles "your limiter is broken": a tracing event for
//! every refusal and every degraded decision, with the limit, the key
//! (digested, never a raw API key), remaining, reason and degraded flag.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use support::*;

const LIMITS: &str = r#"
[fleet]
size = 2

[limits.per-key]
key = "header:x-api-key"
capacity = 2
refill = "1/d"

[[routes]]
path = "/"
limits = ["per-key"]
on_redis_error = "local"
"#;

#[tokio::test(flavor = "current_thread")]
async fn refusals_and_degraded_decisions_leave_evidence() {
    let captured = Captured::default();
    let writer = captured.clone();
    crate::support::init_tracing();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = RedisServer::start();
    let prefix = prefix("evidence");
    let cfg = redis_config(&server, &prefix, "500ms", LIMITS);
    let app = ok_app(cfg).await;
    let secret = "sk_live_do_not_log_me";
    let req = || request("GET", "/", "127.0.0.1:1", &[("x-api-key", secret)]);

    for _ in 0..2 {
        assert_eq!(send(&app, req()).await.status(), 200);
    }
    let _ = captured.take();
    assert_eq!(send(&app, req()).await.status(), 429);
    let refusal = captured.take();
    assert!(refusal.contains("refused"), "{refusal}");
    assert!(refusal.contains("limit=per-key"), "{refusal}");
    assert!(refusal.contains("key=h#"), "{refusal}");
    assert!(refusal.contains("remaining=0"), "{refusal}");
    assert!(refusal.contains("reason=\"limit-exceeded\""), "{refusal}");
    assert!(refusal.contains("degraded=false"), "{refusal}");
    assert!(
        !refusal.contains(secret),
        "a raw API key in the logs: {refusal}"
    );

    server.kill();
    // A key Redis has not refused yet (the refused one is still answered
    // from the refused-key cache until its Retry-After). Local share is
    // 2 ÷ 2 = 1: one admitted, one refused, both degraded.
    let other = || {
        request(
            "GET",
            "/",
            "127.0.0.1:1",
            &[("x-api-key", "sk_live_other_secret")],
        )
    };
    assert_eq!(send(&app, other()).await.status(), 200);
    assert_eq!(send(&app, other()).await.status(), 429);
    let degraded = captured.take();
    let lines: Vec<&str> = degraded.lines().collect();
    assert!(
        lines.iter().any(|l| l.contains("decided locally")
            && l.contains("allowed=true")
            && l.contains("degraded=true")),
        "{degraded}"
    );
    assert!(
        lines.iter().any(|l| l.contains("refused")
            && l.contains("degraded=true")
            && l.contains("limit=per-key")),
        "{degraded}"
    );
    assert!(!degraded.contains("sk_live"), "{degraded}");
}

/// One DEBUG span per decision: route, limits, the key's log id (never the
/// raw API key), outcome, status and degraded, for a decision Redis made,
/// a refusal, and a degraded one.
#[tokio::test(flavor = "current_thread")]
async fn each_decision_has_a_debug_span() {
    let captured = Captured::default();
    let writer = captured.clone();
    crate::support::init_tracing();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = RedisServer::start();
    let prefix = prefix("decision-span");
    let cfg = redis_config(&server, &prefix, "500ms", LIMITS);
    let app = ok_app(cfg).await;
    let secret = "sk_live_not_in_spans";
    let req = || request("GET", "/", "127.0.0.1:1", &[("x-api-key", secret)]);
    let _ = captured.take();
    assert_eq!(send(&app, req()).await.status(), 200);
    let spans = captured.take();
    let closed = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.contains("fleetlimit.decide{") && l.contains("close"))
            .map(str::to_owned)
            .collect()
    };
    let admitted = closed(&spans);
    assert_eq!(admitted.len(), 1, "{spans}");
    let s = &admitted[0];
    for part in [
        "route=\"/\"",
        "limit=\"per-key\"",
        "key=h#",
        "outcome=\"admitted\"",
        "degraded=false",
    ] {
        assert!(s.contains(part), "{part} in {s}");
    }
    assert!(!spans.contains(secret), "a raw API key in a span: {spans}");

    assert_eq!(send(&app, req()).await.status(), 200);
    assert_eq!(send(&app, req()).await.status(), 429);
    let refused = closed(&captured.take());
    assert!(
        refused
            .iter()
            .any(|s| s.contains("outcome=\"refused\"") && s.contains("status=429")),
        "{refused:?}"
    );

    server.kill();
    let other = request("GET", "/", "127.0.0.1:1", &[("x-api-key", "another")]);
    assert_eq!(send(&app, other).await.status(), 200);
    let degraded = closed(&captured.take());
    assert!(
        degraded
            .iter()
            .any(|s| s.contains("outcome=\"admitted\"") && s.contains("degraded=true")),
        "{degraded:?}"
    );
}
