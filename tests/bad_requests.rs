//! Malformed and hostile requests get a documented answer: never a panic,
//! never a 500, never a way out of the limit or into another client's key.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use axum::Router;
use axum::body::Body;
use fleetlimit::RateLimitLayer;
use http::{HeaderValue, Request};
use support::*;

const LIMITS: &str = r#"
[client_ip]
trusted_proxies = ["10.0.0.0/8"]

[limits.per-ip]
key = "ip"
capacity = 3
refill = "1/d"

[limits.per-key]
key = "header:x-api-key"
capacity = 3
refill = "1/d"

[limits.key-or-ip]
key = "header:x-api-key"
on_missing = "ip"
capacity = 2
refill = "1/d"

[[routes]]
path = "/ip"
limits = ["per-ip"]
on_redis_error = "closed"

[[routes]]
path = "/key"
limits = ["per-key"]
on_redis_error = "closed"

[[routes]]
path = "/key-or-ip"
limits = ["key-or-ip"]
on_redis_error = "closed"
"#;

async fn app(server: &RedisServer, prefix: &str) -> Router {
    let cfg = redis_config(server, prefix, "500ms", LIMITS);
    let layer = RateLimitLayer::new(cfg).await.unwrap();
    support::ok_routes(layer, ["/ip", "/key", "/key-or-ip"])
}

async fn statuses(app: &Router, reqs: impl IntoIterator<Item = Request<Body>>) -> Vec<u16> {
    let mut out = Vec::new();
    for r in reqs {
        out.push(send(app, r).await.status().as_u16());
    }
    out
}

#[tokio::test]
async fn spoofed_forwarded_headers_from_untrusted_peers_change_nothing() {
    let server = RedisServer::start();
    let prefix = prefix("spoof");
    let app = app(&server, &prefix).await;
    // An untrusted peer invents a new X-Forwarded-For on every request.
    let got = statuses(
        &app,
        (0..6).map(|i| {
            request(
                "GET",
                "/ip",
                "203.0.113.7:5000",
                &[
                    ("x-forwarded-for", &format!("198.51.100.{i}")),
                    ("forwarded", &format!("for=192.0.2.{i}")),
                ],
            )
        }),
    )
    .await;
    assert_eq!(got, [200, 200, 200, 429, 429, 429]);
    let keys: Vec<String> = server
        .keys_with_pttl(&prefix)
        .into_iter()
        .map(|k| k.0)
        .collect();
    assert_eq!(keys, [format!("{prefix}:per-ip:{{ip:203.0.113.7}}")]);
}

#[tokio::test]
async fn trusted_proxies_are_walked_right_to_left() {
    let server = RedisServer::start();
    let prefix = prefix("proxy");
    let app = app(&server, &prefix).await;
    // Behind the trusted proxy, the client 198.51.100.1 tries to pass as
    // someone else by prepending addresses: the rightmost untrusted hop wins.
    let got = statuses(
        &app,
        (0..5).map(|i| {
            request(
                "GET",
                "/ip",
                "10.0.0.2:80",
                &[(
                    "x-forwarded-for",
                    &format!("192.0.2.{i}, 198.51.100.1, 10.0.0.9"),
                )],
            )
        }),
    )
    .await;
    assert_eq!(got, [200, 200, 200, 429, 429]);
    // Garbage in the chain cannot choose a key: it stops at the last trusted
    // hop (the proxy's own bucket), whatever the garbage says.
    let got = statuses(
        &app,
        (0..4).map(|i| {
            request(
                "GET",
                "/ip",
                "10.0.0.2:80",
                &[("x-forwarded-for", &format!("garbage-{i}, 10.0.0.9"))],
            )
        }),
    )
    .await;
    assert_eq!(got, [200, 200, 200, 429]);
    let mut keys: Vec<String> = server
        .keys_with_pttl(&prefix)
        .into_iter()
        .map(|k| k.0)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            format!("{prefix}:per-ip:{{ip:10.0.0.9}}"),
            format!("{prefix}:per-ip:{{ip:198.51.100.1}}")
        ]
    );
}

#[tokio::test]
async fn a_10kb_api_key_is_bounded_in_redis_and_collides_with_nothing() {
    let server = RedisServer::start();
    let prefix = prefix("huge");
    let app = app(&server, &prefix).await;
    let huge_a = "a".repeat(10 * 1024);
    let huge_b = format!("{}b", "a".repeat(10 * 1024 - 1));
    let got = statuses(
        &app,
        (0..4).map(|_| request("GET", "/key", "127.0.0.1:1", &[("x-api-key", &huge_a)])),
    )
    .await;
    assert_eq!(got, [200, 200, 200, 429]);
    // Differs in the last byte only: its own full bucket.
    let res = send(
        &app,
        request("GET", "/key", "127.0.0.1:1", &[("x-api-key", &huge_b)]),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 2);

    let keys = server.keys_with_pttl(&prefix);
    assert_eq!(keys.len(), 2);
    for (k, _) in &keys {
        assert!(k.len() < 80, "key of {} bytes: {k}", k.len());
        assert_eq!(k.matches('{').count(), 1, "{k}");
    }
    server.assert_every_key_expires(&prefix);
}

#[tokio::test]
async fn keys_with_braces_or_binary_bytes_are_hashed_not_slot_picking() {
    let server = RedisServer::start();
    let prefix = prefix("braces");
    let app = app(&server, &prefix).await;
    let mut req = request("GET", "/key", "127.0.0.1:1", &[("x-api-key", "}{evil")]);
    assert_eq!(send(&app, req).await.status(), 200);
    req = request("GET", "/key", "127.0.0.1:1", &[]);
    req.headers_mut().insert(
        "x-api-key",
        HeaderValue::from_bytes(&[0xff, 0xfe, b'k']).unwrap(),
    );
    assert_eq!(send(&app, req).await.status(), 200);
    let keys = server.keys_with_pttl(&prefix);
    assert_eq!(keys.len(), 2, "one bucket per caller: {keys:?}");
    for (k, pttl) in keys {
        assert!(pttl > 0);
        assert_eq!(k.matches('{').count(), 1, "{k}");
        assert_eq!(k.matches('}').count(), 1, "{k}");
        assert!(k.contains("{h#"), "hashed: {k}");
    }
}

#[tokio::test]
async fn missing_keys_are_rejected_or_counted_by_ip_as_configured() {
    let server = RedisServer::start();
    let prefix = prefix("missing");
    let app = app(&server, &prefix).await;

    // on_missing = "reject" (the default): 401 with a problem body, and no
    // shared "empty" bucket is ever charged.
    for headers in [&[][..], &[("x-api-key", "")][..]] {
        let res = send(&app, request("GET", "/key", "127.0.0.1:1", headers)).await;
        assert_eq!(res.status(), 401);
        assert_eq!(
            header(&res, "content-type").as_deref(),
            Some("application/problem+json")
        );
        let body = body_text(res).await;
        assert!(body.contains("x-api-key"), "{body}");
    }

    // on_missing = "ip": counted by the client IP, in a bucket apart from an
    // API key that happens to spell that IP.
    let got = statuses(
        &app,
        (0..3).map(|_| request("GET", "/key-or-ip", "192.0.2.50:1", &[])),
    )
    .await;
    assert_eq!(got, [200, 200, 429]);
    let spelled = send(
        &app,
        request(
            "GET",
            "/key-or-ip",
            "192.0.2.50:1",
            &[("x-api-key", "192.0.2.50")],
        ),
    )
    .await;
    assert_eq!(spelled.status(), 200);
    let mut keys: Vec<String> = server
        .keys_with_pttl(&prefix)
        .into_iter()
        .map(|k| k.0)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            header_key(&prefix, "key-or-ip", "192.0.2.50"),
            format!("{prefix}:key-or-ip:{{ip:192.0.2.50}}")
        ]
    );
}

#[tokio::test]
async fn no_peer_address_is_a_503_not_a_500_nor_a_shared_bucket() {
    let server = RedisServer::start();
    let prefix = prefix("nopeer");
    let app = app(&server, &prefix).await;
    // A server that forgot `into_make_service_with_connect_info`.
    let req = Request::get("/ip").body(Body::empty()).unwrap();
    let res = send(&app, req).await;
    assert_eq!(res.status(), 503);
    assert!(header_u64(&res, "retry-after") >= 1);
    assert!(
        server.keys_with_pttl(&prefix).is_empty(),
        "nothing was charged"
    );
    // axum's MockConnectInfo and a plain SocketAddr extension both work.
    let app = app.layer(axum::extract::connect_info::MockConnectInfo(
        std::net::SocketAddr::from(([192, 0, 2, 1], 9)),
    ));
    assert_eq!(
        send(&app, Request::get("/ip").body(Body::empty()).unwrap())
            .await
            .status(),
        200
    );
    let mut req = Request::get("/ip").body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(std::net::SocketAddr::from(([192, 0, 2, 2], 9)));
    let app2 = self::app(&server, &prefix).await;
    assert_eq!(send(&app2, req).await.status(), 200);
    let mut keys: Vec<String> = server
        .keys_with_pttl(&prefix)
        .into_iter()
        .map(|k| k.0)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            format!("{prefix}:per-ip:{{ip:192.0.2.1}}"),
            format!("{prefix}:per-ip:{{ip:192.0.2.2}}")
        ]
    );
}
