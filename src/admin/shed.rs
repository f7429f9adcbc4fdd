//! `fleetlimit shed`: set (or clear) the fleet-wide shedding signal every
//! instance with `[shedding]` reads (see docs/algorithms.md, "Load
//! shedding").

use std::time::Duration;

use fred::interfaces::KeysInterface;
use fred::types::Expiration;

use super::Admin;
use crate::store::StoreError;
use crate::store::redis::reply::map_err;

impl Admin {
    /// Sets the fleet-wide shedding pressure to `pressure` (`1.0` =
    /// saturated: normal and sheddable routes are shed) for `duration`, at
    /// `<key_prefix>:shed:{fleet}`; `0` clears it. Returns the key.
    pub(crate) async fn shed(
        &self,
        pressure: f64,
        duration: Duration,
    ) -> Result<String, StoreError> {
        check_shed(pressure, duration).map_err(StoreError::Protocol)?;
        let key = self.config.shed_fleet_key();
        let pool = self.store.pool();
        if pressure == 0.0 {
            let _: i64 = pool.del(&key).await.map_err(map_err)?;
        } else {
            let ms = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
            let _: () = pool
                .set(
                    &key,
                    pressure.to_string(),
                    Some(Expiration::PX(ms)),
                    None,
                    false,
                )
                .await
                .map_err(map_err)?;
        }
        Ok(key)
    }

    /// What [`shed`](Self::shed) accepts: a number ≥ 0 and, to set one, a
    /// duration of at least a millisecond (every key fleetlimit writes
    /// expires).
    pub(crate) fn check_shed(pressure: f64, duration: Duration) -> Result<(), String> {
        check_shed(pressure, duration)
    }
}

fn check_shed(pressure: f64, duration: Duration) -> Result<(), String> {
    if !(pressure.is_finite() && pressure >= 0.0) {
        return Err(format!(
            "the pressure must be a number of at least 0 (1.0 = saturated), not {pressure}"
        ));
    }
    if pressure > 0.0 && duration < Duration::from_millis(1) {
        return Err("the signal needs a duration (--for 10m): it must expire".into());
    }
    Ok(())
}
