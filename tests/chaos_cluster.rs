//! Chaos on a 3-primary Redis Cluster: one primary is killed long enough for
//! the cluster to notice (no replicas: its slots are down, then the whole
//! cluster refuses), then started again from its nodes.conf.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::time::Duration;

use support::chaos::{self, Fleet};
use support::*;

/// The cluster's `cluster-node-timeout` (2 s in `RedisCluster::start`): a
/// primary unreachable this long is marked failing, and the cluster,
/// without replicas, refuses; a node back rejoins after about as long.
const NODE_TIMEOUT: Duration = Duration::from_millis(1_000);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_primary_killed_and_back() {
    init_tracing();
    let node_timeout = NODE_TIMEOUT.as_millis().to_string();
    let cluster = RedisCluster::start_with(&["--cluster-node-timeout", &node_timeout]);
    let prefix = prefix("chaos-cluster");
    let fleet = Fleet::start(
        || {
            cluster_config(
                &cluster,
                &prefix,
                &format!("{}ms", chaos::DEADLINE_MS),
                chaos::LIMITS,
            )
        },
        3,
    )
    .await;
    let (samples, fault, recovered) = chaos::run(
        &fleet,
        "cluster",
        // Down half as long again as the cluster takes to notice.
        NODE_TIMEOUT.mul_f64(1.5),
        || cluster.nodes[1].kill(),
        || cluster.nodes[1].restart(),
    )
    .await;
    chaos::assert_scenario("cluster", &samples, fault, recovered, &fleet, true);
    chaos::assert_exact(&fleet, "cluster").await;
    cluster.assert_every_key_expires(&prefix);
}
