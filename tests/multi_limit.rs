//! Several limits per request, decided all or nothing: a tenant limit inside
//! a limit shared by every tenant. A refused request is charged nowhere, so
//! one noisy tenant cannot starve the others through its refusals — on a
//! standalone Redis (one script call) and on a 3-primary cluster, where the
//! tenant's key and the shared key live in different slots.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::collections::BTreeMap;

use axum::Router;
use support::*;

const LIMITS: &str = r#"
[limits.tenant]
key = "header:x-tenant"
capacity = 40
refill = "40/h"

[limits.shared]
key = "global"
capacity = 100
refill = "100/h"

[[routes]]
path = "/"
limits = ["tenant", "shared"]
on_redis_error = "closed"
"#;

async fn run_scenario(app: &Router) -> BTreeMap<&'static str, usize> {
    let mut admitted = BTreeMap::new();
    let hit = |app: &Router, tenant: &'static str| {
        let app = app.clone();
        async move {
            let res = send(
                &app,
                request("GET", "/", "127.0.0.1:1", &[("x-tenant", tenant)]),
            )
            .await;
            let s = res.status().as_u16();
            assert!(s == 200 || s == 429, "{tenant}: {s}");
            (tenant, s == 200)
        }
    };
    for _ in 0..200 {
        let (t, ok) = hit(app, "A").await;
        *admitted.entry(t).or_insert(0) += usize::from(ok);
    }
    // B, C and D take turns, 30 requests each.
    for _ in 0..30 {
        for t in ["B", "C", "D"] {
            let (t, ok) = hit(app, t).await;
            *admitted.entry(t).or_insert(0) += usize::from(ok);
        }
    }
    admitted
}

fn assert_fair(admitted: &BTreeMap<&str, usize>) {
    assert_eq!(admitted["A"], 40, "{admitted:?}");
    // 60 left in the shared limit: had A's 160 refusals been charged there,
    // the others would get nothing.
    assert_eq!(admitted["B"], 20, "{admitted:?}");
    assert_eq!(admitted["C"], 20, "{admitted:?}");
    assert_eq!(admitted["D"], 20, "{admitted:?}");
}

#[tokio::test]
async fn a_noisy_tenant_does_not_starve_the_others_standalone() {
    let server = RedisServer::start();
    let prefix = prefix("tenants");
    let cfg = redis_config(&server, &prefix, "500ms", LIMITS);
    let app = ok_app(cfg).await;
    assert_fair(&run_scenario(&app).await);
    server.assert_every_key_expires(&prefix);
    // The shared bucket holds what was admitted, no more.
    let shared = tokens(
        &server,
        &format!("{prefix}:shared:{{g:all}}"),
        100.0,
        100.0 / 3600.0,
    );
    assert!(shared < 0.5, "{shared}");
}

#[tokio::test]
async fn a_noisy_tenant_does_not_starve_the_others_on_a_cluster() {
    init_tracing();
    let cluster = RedisCluster::start();
    let prefix = prefix("tenants-cluster");
    let cfg = cluster_config(&cluster, &prefix, "1s", LIMITS);
    let app = ok_app(cfg).await;
    // The tenant key and the shared key hash to different slots: the layer
    // decides them in order and refunds the earlier one on a later refusal,
    // instead of letting Redis answer CROSSSLOT.
    let slot = |k: &str| cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", k]).unwrap();
    assert_ne!(
        slot(&header_key(&prefix, "tenant", "A")),
        slot(&format!("{prefix}:shared:{{g:all}}"))
    );
    assert_fair(&run_scenario(&app).await);
    cluster.assert_every_key_expires(&prefix);
}
