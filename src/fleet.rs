//! Fleet discovery: each instance heartbeats into a sorted set in Redis
//! (`lua/heartbeat.lua`) and reads back how many instances are alive, the
//! N the `local` fallback divides limits by.

#[cfg(feature = "redis")]
use {
    crate::config::Heartbeat,
    crate::store::redis::reply::map_err,
    crate::store::{RedisStore, StoreError},
    fred::interfaces::ClientLike,
    fred::types::config::Options,
    fred::types::{ClusterHash, CustomCommand, Value},
    std::sync::atomic::{AtomicU32, Ordering},
    std::sync::{Arc, Weak},
    std::time::Duration,
};

#[cfg(feature = "redis")]
const HEARTBEAT: &str = include_str!("../lua/heartbeat.lua");

/// Starts the heartbeat task; it ends when `fleet` (the layer's fleet
/// size) is dropped with the last clone of the layer.
/// `instance`: this layer's id, the member it heartbeats as.
#[cfg(feature = "redis")]
pub(crate) fn start(
    store: RedisStore,
    fleet: Weak<AtomicU32>,
    key: String,
    hb: Heartbeat,
    instance: Arc<str>,
) {
    // Registered here, where the layer is built, not in the task.
    let gauge = crate::metrics::FleetMetrics::new();
    if let Some(size) = fleet.upgrade() {
        gauge.set(size.load(Ordering::Relaxed));
    }
    tokio::spawn(heartbeat(store, fleet, key, hb, instance, gauge));
}

/// Heartbeats until the layer is gone. While Redis is down the last count
/// seen is kept (an outage is no reason to assume the fleet shrank).
#[cfg(feature = "redis")]
async fn heartbeat(
    store: RedisStore,
    fleet: Weak<AtomicU32>,
    key: String,
    hb: Heartbeat,
    instance: Arc<str>,
    gauge: crate::metrics::FleetMetrics,
) {
    let mut tick = tokio::time::interval(hb.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(size) = fleet.upgrade() else {
            // Like a crashed instance, this one ages out after `dead_after`.
            return;
        };
        match beat(&store, &key, &instance, hb.dead_after).await {
            Ok(n) => {
                let n = n.max(1);
                gauge.set(n);
                if size.swap(n, Ordering::Relaxed) != n {
                    tracing::info!(target: "fleetlimit", fleet_size = n, "fleet size changed");
                }
            }
            Err(e) => {
                tracing::debug!(target: "fleetlimit", error = %e, "heartbeat failed; keeping the last fleet size")
            }
        }
    }
}

/// Records this instance as alive in the fleet's sorted set (scored by
/// Redis `TIME`), prunes instances silent for `dead_after`, keeps an
/// expiry on the set, and returns how many are alive.
#[cfg(feature = "redis")]
async fn beat(
    store: &RedisStore,
    key: &str,
    instance: &str,
    dead_after: Duration,
) -> Result<u32, StoreError> {
    let opts = Options {
        timeout: Some(dead_after.min(Duration::from_secs(1))),
        fail_fast: true,
        max_attempts: Some(1),
        ..Options::default()
    };
    let slot = ClusterHash::Custom(fred::util::redis_keyslot(key.as_bytes()));
    let eval = CustomCommand::new_static("EVAL", slot, false);
    let args: Vec<Value> = vec![
        HEARTBEAT.into(),
        1.into(),
        key.into(),
        instance.into(),
        (dead_after.as_millis() as i64).into(),
    ];
    let n: i64 = store
        .pool()
        .with_options(&opts)
        .custom(eval, args)
        .await
        .map_err(map_err)?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// Unique enough among the instances of one fleet: the process id and a
/// random part (a host may run several layers, or several processes).
pub(crate) fn instance_id() -> String {
    use std::hash::{BuildHasher, RandomState};
    let nonce = RandomState::new().hash_one(std::time::SystemTime::now());
    format!("{}-{nonce:016x}", std::process::id())
}
