//! Chaos with Sentinel: 1 primary + 1 replica + 3 sentinels. The primary is
//! killed; while the sentinels fail over, routes follow their failure
//! policy, and once the replica is promoted the layer decides by Redis again
//! without a restart.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::time::{Duration, Instant};

use support::chaos::{self, Fleet};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_sentinel_fails_over() {
    init_tracing();
    let setup = SentinelSetup::start();
    let prefix = prefix("chaos-sentinel");
    let url = setup.url();
    let config = || {
        config_at(
            &url,
            &prefix,
            &format!("{}ms", chaos::DEADLINE_MS),
            chaos::LIMITS,
        )
    };
    let fleet = Fleet::start(config, 3).await;
    let old = setup.primary.port;
    assert_eq!(setup.primary_port(), Some(old));

    let (samples, fault, recovered) = chaos::run(
        &fleet,
        "sentinel",
        Duration::from_millis(500),
        || setup.primary.kill(),
        || {},
    )
    .await;
    // The sentinel asked may learn of the failover from the one that ran it
    // only at its next hello (every 2 s): ask for up to the failover
    // timeout (5 s) before calling it a failure.
    let asked = Instant::now();
    let mut promoted = setup.primary_port();
    while promoted != Some(setup.replica.port) && asked.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        promoted = setup.primary_port();
    }
    assert_eq!(
        promoted,
        Some(setup.replica.port),
        "the sentinels promoted the replica"
    );
    println!("failover and recovery took {:?}", recovered - fault);
    chaos::assert_scenario("sentinel", &samples, fault, recovered, &fleet, true);
    chaos::assert_exact(&fleet, "sentinel").await;
    let started = Instant::now();
    setup.replica.assert_every_key_expires(&prefix);
    assert!(started.elapsed() < Duration::from_secs(10));
}
